"""A fleet of simulated dsh agents, deterministic from a seed.

Each agent writes a session log (:mod:`producers.simulated_logs`, in the
fleet's formats: v0, v3, v4) through realistic turns: streamed reasoning,
text and parallel tool-call deltas, tool calls and results (some large),
max-tokens cut-offs, aborted and errored turns, rejected pre-steps (turns
without a step), injected context, request header changes, retries,
compaction replaces and tool-result trims. For every model request it
publishes an attestation of the request it "sent".

Fault knobs inject exactly countable defects, each recorded in the
ground-truth manifest with its session and seq:

* ``unlogged`` – a request carried content the log does not have (its
  attestation digest covers an extra message);
* ``dropped`` – an event never published (a gap);
* ``duplicate`` – a record published twice (exact repeat);
* ``lossless`` – a record whose JSON holds an integer beyond 2^53;
* ``unknown`` – an event of an unknown type without ``ignorable``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import msgspec

from dsh_core.jsonvalue import sha256_jcs, thaw
from dsh_kafka.records import Attestation, SessionRecord, attestation_record, header_record
from dsh_core.request import build_request, request_digest

from .simulated_logs import FORMATS, Block, SimulatedLog, open_log

__all__ = ["FAULT_KINDS", "FORMATS", "FaultPlan", "SimulatorConfig", "SimulatedSession", "Defect", "fault_assignment",
           "simulate_session", "messages_digest"]

FAULT_KINDS = ("unlogged", "dropped", "duplicate", "lossless", "unknown")
SYSTEM = "You are a coding agent. Keep replies short."
WORDS = ("Let", " me", " look", " at", " the", " tests", " first", ".", " The", " failure", " is", " in",
         " parse", "_line", ";", " I", " will", " fix", " it", " now", "\n", " `", "src", "/", "main", ".py", "`")
TOOLS = [{"name": "bash", "description": "Run a shell command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
         {"name": "read", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]


@dataclass(frozen=True)
class FaultPlan:
    """How many defects of each kind the whole fleet gets."""

    unlogged: int = 0
    dropped: int = 0
    duplicate: int = 0
    lossless: int = 0
    unknown: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, kind) for kind in FAULT_KINDS)


@dataclass(frozen=True)
class SimulatorConfig:
    sessions: int = 50
    seed: int = 1
    min_turns: int = 1
    max_turns: int = 4
    big_result_probability: float = 0.01
    big_result_bytes: tuple[int, int] = (1 << 20, 3 << 20)
    faults: FaultPlan = FaultPlan()
    #: the session formats, by turns: session ``i`` is written in ``formats[i % len(formats)]``
    formats: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        unknown = [version for version in self.formats if version not in FORMATS]
        if not self.formats or unknown:
            raise ValueError(f"simulated formats must be some of {', '.join(map(str, FORMATS))}, "
                             f"got {', '.join(map(str, self.formats)) or 'none'}")


@dataclass(frozen=True)
class Defect:
    kind: str
    seq: int


@dataclass
class SimulatedSession:
    """Ground truth of one session."""

    session_id: str
    format: int = 0
    next_seq: int = 0
    messages_digest: str = ""
    turns: int = 0
    attestations: int = 0
    defects: list[Defect] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "defects": [asdict(d) for d in self.defects]}


def messages_digest(messages: list[Any]) -> str:
    """The ground-truth digest of a derived history (sha256 of its JCS form)."""
    return sha256_jcs(thaw(messages))


class _Agent:
    """One simulated agent loop over a :class:`SessionLog`."""

    def __init__(self, session_id: str, config: SimulatorConfig, faults: list[str], rng: random.Random,
                 version: int) -> None:
        self.rng = rng
        self.config = config
        start = 1_767_225_600_000 + rng.randrange(10**9)
        self._now = start

        def clock() -> int:
            self._now += rng.randint(0, 40)
            return self._now

        self.log: SimulatedLog = open_log(version, session_id, start, f"/home/dev/project-{rng.randrange(20)}",
                                          clock)
        self.truth = SimulatedSession(session_id, version)
        self.faults = faults  # kinds this session must get, each once
        self.out: list[SessionRecord] = [header_record(self.log.header)]
        self.model = rng.choice(["deepseek-chat", "deepseek-reasoner"])
        self.header_sent: Any = None
        self.context_sent: Any = None
        self.ids = iter(range(10**9))
        self.fault_turn = 1
        self.armed = False

    # ---------------------------------------------------------- plumbing

    def publish_pending(self) -> None:
        """Turn pending events into records (one append batch), injecting
        the record-level faults this session owes."""
        for record in self.log.take_records():
            if not self.armed:
                self.out.append(record)
                continue
            if "dropped" in self.faults and record.count == 1 and record.seq > 0:
                self.faults.remove("dropped")
                self.truth.defects.append(Defect("dropped", record.seq))
                continue
            if "lossless" in self.faults and b'"type":"session/title"' in record.value:
                self.faults.remove("lossless")
                self.truth.defects.append(Defect("lossless", record.seq))
                record = msgspec.structs.replace(record, value=record.value.replace(
                    b'"source":', b'"counter":9007199254740993,"source":', 1))
            self.out.append(record)
            if "duplicate" in self.faults:
                self.faults.remove("duplicate")
                self.truth.defects.append(Defect("duplicate", record.seq))
                self.out.append(record)

    def attest(self, turn: int, step: int) -> None:
        """The loop sends a request now: publish what precedes it, then the
        attestation of the request it built (maybe with unlogged content)."""
        boundary = self.log.seq
        messages = self.log.messages()
        if "unlogged" in self.faults and self.armed:
            self.faults.remove("unlogged")
            self.truth.defects.append(Defect("unlogged", boundary))
            messages = messages + [{"id": "unlogged-reminder", "role": "user", "source": {"kind": "user"},
                                    "content": [{"type": "text", "text": "(a reminder the log never saw)"}]}]
        request = build_request(self.log.request_header(), messages, self.log.session_id)
        self.publish_pending()
        self.out.append(attestation_record(self.log.session_id, Attestation(turn, step, boundary, request_digest(request))))
        self.truth.attestations += 1

    def message_id(self, prefix: str) -> str:
        return f"{prefix}-{self.log.session_id[-6:]}-{next(self.ids)}"

    def words(self, low: int, high: int) -> list[str]:
        return [self.rng.choice(WORDS) for _ in range(self.rng.randint(low, high))]

    # ------------------------------------------------------------ a turn

    def run(self) -> Iterator[list[SessionRecord]]:
        rng = self.rng
        turns = rng.randint(self.config.min_turns, self.config.max_turns)
        self.fault_turn = rng.randint(1, turns)  # record-level faults land in this turn
        for turn in range(1, turns + 1):
            self.armed = turn >= self.fault_turn
            self.turn(turn)
            self.publish_pending()
            yield self.drain()
            if rng.random() < 0.15 and len(self.log.surface_nodes) > 3:
                self.compact()
                self.publish_pending()
                yield self.drain()
        if "unknown" in self.faults:
            self.faults.remove("unknown")
            seq = self.log.append("x-sim/required-extension", {"note": "a newer harness wrote this"}, refused=True)
            self.truth.defects.append(Defect("unknown", seq))
            self.publish_pending()
            yield self.drain()
        assert not self.faults, f"faults not injected: {self.faults}"
        self.truth.next_seq = self.log.seq
        self.truth.turns = turns
        self.truth.messages_digest = messages_digest(self.log.messages())
        yield self.drain()

    def drain(self) -> list[SessionRecord]:
        out, self.out = self.out, []
        return out

    def user_message(self, text: str, runtime_context: bool = False) -> int:
        source = (self.log.runtime_context_source([{"name": "sandbox:policy", "text": text}]) if runtime_context
                  else {"kind": "user"})
        return self.log.append("user/message", {"id": self.message_id("u"), "role": "user",
                                                "content": [{"type": "text", "text": text}], "source": source},
                               surface_op="append")

    def ensure_header(self, turn: int, force: bool) -> None:
        if force or self.header_sent is None:
            config: dict[str, Any] = {"provider": self.log.provider, "model": self.model}
            if self.rng.random() < 0.5:
                config["maxTokens"] = self.rng.choice([4096, 8192])
            header = self.log.request_header_value(config, SYSTEM, TOOLS)
            reason = "initial" if self.header_sent is None else "change"
            self.log.append("request/header", {"header": header, "reason": reason})
            self.header_sent = header
        context = {"provider": self.log.provider, "model": self.model, "contextWindow": 128000}
        if context != self.context_sent:
            self.log.append("request/context", context)
            self.context_sent = context

    def turn(self, turn: int) -> None:
        rng, log = self.rng, self.log
        if rng.random() < 0.3:
            log.append("agent/inbox/spliced", {"target": "next-turn", "start": 0, "inserted": []})
        log.append("turn/start", {"turn": turn})
        if self.armed and "lossless" in self.faults:
            log.append("session/title", {"title": "Fixing tests", "messageSeqs": [], "source": {"kind": "user"}})
        if rng.random() < 0.07 and not (self.armed and "unlogged" in self.faults):
            # a pre-step hook rejects the step: no step at all
            log.append("hook/result", {"turn": turn, "point": "pre-step", "handlerId": "policy", "decision": "block",
                                       "durationMs": 3})
            log.append("turn/end", {"turn": turn, "reason": {"kind": "blocked"}})
            return
        max_tokens_hit = False
        for step in range(1, rng.randint(1, 4) + 1):
            log.append("step/start", {"turn": turn, "step": step})
            log.begin_step(turn, step, SYSTEM)
            if step == 1:
                asked = self.user_message(" ".join(self.words(4, 20)).strip() or "Go on.")
                if rng.random() < 0.4:
                    self.user_message("Current runtime context: sandbox off.", runtime_context=True)
                if turn == 1 and rng.random() < 0.5:
                    log.append("session/title", {"title": "Fixing tests", "messageSeqs": [asked],
                                                 "source": {"kind": "fallback"}})
            if rng.random() < 0.1:
                self.model = "deepseek-reasoner" if self.model == "deepseek-chat" else "deepseek-chat"
                self.ensure_header(turn, force=True)
            else:
                self.ensure_header(turn, force=False)
            outcome = rng.random()
            if outcome < 0.05:  # the provider fails: a failed attempt, step/end, turn/end error
                self.attest(turn, step)
                failure = {"message": "upstream 500", "code": "SERVER", "status": 500}
                log.failed_attempt(turn, step, failure)
                log.append("step/end", {"turn": turn, "step": step})
                log.append("turn/end", {"turn": turn, "reason": {"kind": "error", "error": failure}})
                return
            if outcome < 0.10:  # retry: a failed attempt, llm/retry, then a second attempt
                self.attest(turn, step)
                failure = {"message": "empty", "code": "EMPTY_RESPONSE"}
                log.failed_attempt(turn, step, failure)
                log.retry(turn, step, self.message_id("r"), failure)
            if outcome > 0.96:  # the user cancels mid-stream: interrupted prefix, turn aborted
                self.attest(turn, step)
                self.stream_answer(turn, step, calls=0, finish=None, interrupted=True)
                log.append("step/end", {"turn": turn, "step": step})
                log.append("turn/end", {"turn": turn, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
                return
            self.attest(turn, step)
            calls = rng.choice([0, 0, 1, 1, 2, 3])
            finish = "tool-calls" if calls else "stop"
            if rng.random() < 0.06:
                finish, calls, max_tokens_hit = "max-tokens", 0, True
            called = self.stream_answer(turn, step, calls, finish)
            self.run_tools(turn, step, called)
            log.append("step/end", {"turn": turn, "step": step})
            self.publish_pending()
            if not called:
                break
        log.append("turn/end", {"turn": turn, "reason": {"kind": "max-tokens" if max_tokens_hit else "completed"}})

    def stream_answer(self, turn: int, step: int, calls: int, finish: str | None,
                      interrupted: bool = False) -> list[Block]:
        """The model's answer; returns the tool calls it made."""
        rng = self.rng
        kinds = (["reasoning"] if self.model == "deepseek-reasoner" else []) + ["text"]
        blocks = [Block(kind, tuple(self.words(1, 80))) for kind in kinds]
        for _ in range(calls):
            tool = rng.choice(["bash", "read"])
            args = ('{"', "command" if tool == "bash" else "path", '": "', *self.words(1, 6), '"}')
            blocks.append(Block("tool-call", args, self.message_id("call"), tool))
        usage = {"inputTokens": rng.randint(500, 20000), "outputTokens": rng.randint(10, 2000)}
        shown = [b for b in blocks if b.kind != "tool-call"] if interrupted else blocks
        message = {"id": self.message_id("a"), "role": "assistant", "content": [b.content for b in shown],
                   "source": {"kind": "model", "provider": self.log.provider, "model": self.model}}
        self.log.answer(turn, step, message, blocks, usage, finish, interrupted)
        return [b for b in shown if b.kind == "tool-call"]

    def run_tools(self, turn: int, step: int, called: list[Block]) -> None:
        rng, log = self.rng, self.log
        calls = {}
        for block in called:
            calls[block.call_id] = log.append("tool/call", {"turn": turn, "step": step, "callId": block.call_id,
                                                            "name": block.name, "arguments": block.content["arguments"]})
        for block in rng.sample(called, len(called)):  # results arrive in any order
            if rng.random() < self.config.big_result_probability:
                size = rng.randint(*self.config.big_result_bytes)
                output = ("".join(self.words(200, 200)) * (size // 800 + 1))[:size]
            else:
                output = "".join(self.words(5, 120))
            message_id, is_error = self.message_id("t"), rng.random() < 0.1
            result = log.append("tool/result", {"turn": turn, "step": step, "message": log.tool_result_message(
                message_id, block.call_id, output, is_error)}, surface_op="append", sources=[calls[block.call_id]])
            if len(output) > 2000 or rng.random() < 0.05:  # trim it for the model
                trimmed = log.tool_result_message(message_id, block.call_id, output[:200] + "…[trimmed]", is_error)
                log.append("tool/result", {"turn": turn, "step": step, "message": trimmed},
                           surface_op=log.replace(result, result), sources=[result])

    def compact(self) -> None:
        nodes = list(self.log.compactable)
        keep = self.rng.randint(1, 3)
        shadowed = nodes[:-keep] if len(nodes) > keep else nodes[:1]
        self.log.compaction(self.message_id("c"), shadowed, self.message_id("s"))


def fault_assignment(config: SimulatorConfig) -> dict[int, list[str]]:
    """Which session gets which fault: one fault per session at most, so
    each defect stays countable on its own (a gap would hide what follows)."""
    rng = random.Random(f"{config.seed}:faults")
    kinds = [kind for kind in FAULT_KINDS for _ in range(getattr(config.faults, kind))]
    if len(kinds) > config.sessions:
        raise ValueError(f"{len(kinds)} faults need at least as many sessions (have {config.sessions})")
    return {index: [kind] for index, kind in zip(rng.sample(range(config.sessions), len(kinds)), kinds)}


def simulate_session(config: SimulatorConfig, index: int, faults: list[str] | None = None
                     ) -> tuple[SimulatedSession, Iterator[list[SessionRecord]]]:
    """Session ``index`` of the fleet: its ground truth (filled in as the
    iterator runs) and the record batches to publish, in order."""
    rng = random.Random(f"{config.seed}:{index}")
    session_id = f"sim-{config.seed}-{index:06d}-{rng.randrange(16**6):06x}"
    if faults is None:
        faults = list(fault_assignment(config).get(index, []))
    agent = _Agent(session_id, config, faults, rng, config.formats[index % len(config.formats)])
    return agent.truth, agent.run()
