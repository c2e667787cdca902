"""A fleet of simulated dsh agents, deterministic from a seed.

Each agent drives a :class:`SessionLog` through realistic turns: streamed
reasoning, text and parallel tool-call deltas (published as packed rows, as
dsh stores them), tool calls and results (some large), max-tokens cut-offs,
aborted and errored turns, rejected pre-steps (turns without a step),
injected context, request header changes, retries, compaction replaces and
tool-result trims. For every model request it publishes an attestation of
the request it "sent".

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

from dsh_core.events import Event
from dsh_core.jsonvalue import sha256_jcs, thaw
from dsh_kafka.records import Attestation, SessionRecord, attestation_record, header_record, records_for_batch
from dsh_core.request import build_request, request_digest
from dsh_core.session import SessionLog
from dsh_core.session_header import SessionHeader

__all__ = ["FAULT_KINDS", "FaultPlan", "SimulatorConfig", "SimulatedSession", "Defect", "fault_assignment",
           "simulate_session", "messages_digest"]

FAULT_KINDS = ("unlogged", "dropped", "duplicate", "lossless", "unknown")
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


@dataclass(frozen=True)
class Defect:
    kind: str
    seq: int


@dataclass
class SimulatedSession:
    """Ground truth of one session."""

    session_id: str
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

    def __init__(self, session_id: str, config: SimulatorConfig, faults: list[str], rng: random.Random) -> None:
        self.rng = rng
        self.config = config
        start = 1_767_225_600_000 + rng.randrange(10**9)
        self._now = start

        def clock() -> int:
            self._now += rng.randint(0, 40)
            return self._now

        header = SessionHeader(id=session_id, createdAt=start, cwd=f"/home/dev/project-{rng.randrange(20)}",
                               delegationDepth=0)
        self.log = SessionLog(session_id, header=header, clock=clock)
        self.truth = SimulatedSession(session_id)
        self.faults = faults  # kinds this session must get, each once
        self.pending: list[Event] = []
        self.out: list[SessionRecord] = [header_record(header)]
        self.model = rng.choice(["deepseek-chat", "deepseek-reasoner"])
        self.header_sent: Any = None
        self.context_sent: Any = None
        self.ids = iter(range(10**9))
        self.fault_turn = 1
        self.armed = False

    # ---------------------------------------------------------- plumbing

    def append(self, event_type: str, data: Any, **surface: Any) -> Event:
        event = self.log.append(event_type, data, **surface)
        self.pending.append(event)
        return event

    def publish_pending(self) -> None:
        """Turn pending events into records (one append batch), injecting
        the record-level faults this session owes."""
        if not self.pending:
            return
        records = records_for_batch(self.log.session_id, self.pending)
        self.pending = []
        for record in records:
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
                record = SessionRecord(record.session_id, record.kind, record.seq, record.count,
                                       record.value.replace(b'"source":', b'"counter":9007199254740993,"source":', 1))
            self.out.append(record)
            if "duplicate" in self.faults:
                self.faults.remove("duplicate")
                self.truth.defects.append(Defect("duplicate", record.seq))
                self.out.append(record)

    def attest(self, turn: int, step: int) -> None:
        """The loop sends a request now: publish what precedes it, then the
        attestation of the request it built (maybe with unlogged content)."""
        boundary = self.log.seq
        messages = self.log.derive_messages()
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
            event = self.append("x-sim/required-extension", {"note": "a newer harness wrote this"})
            self.truth.defects.append(Defect("unknown", event.seq))
            self.publish_pending()
            yield self.drain()
        assert not self.faults, f"faults not injected: {self.faults}"
        self.truth.next_seq = self.log.seq
        self.truth.turns = turns
        self.truth.messages_digest = messages_digest(self.log.derive_messages())
        yield self.drain()

    def drain(self) -> list[SessionRecord]:
        out, self.out = self.out, []
        return out

    def user_message(self, text: str, kind: str = "user") -> Event:
        source: dict[str, Any] = {"kind": kind} if kind == "user" else {"kind": "plugin", "plugin": "context",
                                                                         "form": "snapshot", "sections": []}
        return self.append("user/message", {"id": self.message_id("u"), "role": "user",
                                            "content": [{"type": "text", "text": text}], "source": source},
                           surface_op="append")

    def ensure_header(self, turn: int, force: bool) -> None:
        if force or self.header_sent is None:
            config: dict[str, Any] = {"provider": "deepseek", "model": self.model}
            if self.rng.random() < 0.5:
                config["maxTokens"] = self.rng.choice([4096, 8192])
            header = {"config": config, "system": "You are a coding agent. Keep replies short.",
                      "tools": TOOLS}
            reason = "initial" if self.header_sent is None else "change"
            self.append("request/header", {"header": header, "reason": reason})
            self.header_sent = header
        context = {"provider": "deepseek", "model": self.model, "contextWindow": 128000}
        if context != self.context_sent:
            self.append("request/context", context)
            self.context_sent = context

    def turn(self, turn: int) -> None:
        rng = self.rng
        if rng.random() < 0.3:
            self.append("agent/inbox/spliced", {"target": "next-turn", "start": 0, "inserted": []})
        self.append("turn/start", {"turn": turn})
        if self.armed and "lossless" in self.faults:
            self.append("session/title", {"title": "Fixing tests", "messageSeqs": [], "source": {"kind": "fallback"}})
        if rng.random() < 0.07 and not (self.armed and "unlogged" in self.faults):
            # a pre-step hook rejects the step: no step at all
            self.append("hook/result", {"turn": turn, "point": "pre-step", "handlerId": "policy", "decision": "block",
                                        "durationMs": 3})
            self.append("turn/end", {"turn": turn, "reason": {"kind": "blocked"}})
            return
        max_tokens_hit = False
        for step in range(1, rng.randint(1, 4) + 1):
            self.append("step/start", {"turn": turn, "step": step})
            if step == 1:
                self.user_message(" ".join(self.words(4, 20)).strip() or "Go on.")
                if rng.random() < 0.4:
                    self.user_message("Current runtime context: sandbox off.", kind="plugin")
                if turn == 1 and rng.random() < 0.5:
                    self.append("session/title", {"title": "Fixing tests", "messageSeqs": [],
                                                  "source": {"kind": "fallback"}})
            if rng.random() < 0.1:
                self.model = "deepseek-reasoner" if self.model == "deepseek-chat" else "deepseek-chat"
                self.ensure_header(turn, force=True)
            else:
                self.ensure_header(turn, force=False)
            outcome = rng.random()
            if outcome < 0.05:  # the provider fails: error finish, step/end, turn/end error
                self.attest(turn, step)
                failure = {"message": "upstream 500", "code": "SERVER", "status": 500}
                self.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {
                    "type": "finish", "reason": {"kind": "error", "failure": failure}}})
                self.append("step/end", {"turn": turn, "step": step})
                self.append("turn/end", {"turn": turn, "reason": {"kind": "error", "error": failure}})
                return
            if outcome < 0.10:  # retry: an error finish, llm/retry, then a second attempt
                self.attest(turn, step)
                self.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {
                    "type": "finish", "reason": {"kind": "error", "failure": {"message": "empty", "code": "EMPTY_RESPONSE"}}}})
                self.append("llm/retry", {"retryId": self.message_id("r"), "turn": turn, "step": step,
                                          "provider": "deepseek", "mode": "auto", "policyKey": "empty", "retry": 1,
                                          "delayMs": 100, "failure": {"message": "empty", "code": "EMPTY_RESPONSE"}})
            if outcome > 0.96:  # the user cancels mid-stream: interrupted prefix, turn aborted
                self.attest(turn, step)
                self.stream_answer(turn, step, calls=0, finish=None, interrupted=True)
                self.append("step/end", {"turn": turn, "step": step})
                self.append("turn/end", {"turn": turn, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
                return
            self.attest(turn, step)
            calls = rng.choice([0, 0, 1, 1, 2, 3])
            finish = "tool-calls" if calls else "stop"
            if rng.random() < 0.06:
                finish, calls, max_tokens_hit = "max-tokens", 0, True
            call_ids = self.stream_answer(turn, step, calls, finish)
            self.run_tools(turn, step, call_ids)
            self.append("step/end", {"turn": turn, "step": step})
            self.publish_pending()
            if not call_ids:
                break
        self.append("turn/end", {"turn": turn, "reason": {"kind": "max-tokens" if max_tokens_hit else "completed"}})

    def stream_answer(self, turn: int, step: int, calls: int, finish: str | None,
                      interrupted: bool = False) -> list[str]:
        rng = self.rng
        sources: list[int] = []
        blocks: list[dict[str, Any]] = []

        def chunk(body: dict[str, Any]) -> None:
            sources.append(self.append("assistant/chunk", {"turn": turn, "step": step, "chunk": body}).seq)

        index = 0
        for kind in (["reasoning"] if self.model == "deepseek-reasoner" else []) + ["text"]:
            pieces = self.words(1, 80)
            chunk({"type": "block-start", "index": index, "blockType": kind})
            for piece in pieces:
                chunk({"type": f"{kind}-delta", "index": index, "text": piece})
            block = {"type": kind, "text": "".join(pieces)}
            chunk({"type": "block-end", "index": index, "block": block})
            blocks.append(block)
            index += 1
        call_ids = []
        for _ in range(calls):
            call_id = self.message_id("call")
            tool = rng.choice(["bash", "read"])
            args = ['{"', "command" if tool == "bash" else "path", '": "', *self.words(1, 6), '"}']
            chunk({"type": "block-start", "index": index, "blockType": "tool-call"})
            for k, piece in enumerate(args):
                body: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": call_id}
                if k == 0:
                    body["name"] = tool
                body["argumentsDelta"] = piece
                chunk(body)
            block = {"type": "tool-call", "id": call_id, "name": tool, "arguments": "".join(args)}
            chunk({"type": "block-end", "index": index, "block": block})
            blocks.append(block)
            call_ids.append(call_id)
            index += 1
        usage = {"inputTokens": rng.randint(500, 20000), "outputTokens": rng.randint(10, 2000)}
        if finish is not None:
            chunk({"type": "usage", "usage": usage})
            chunk({"type": "finish", "reason": {"kind": finish}})
        data: dict[str, Any] = {"turn": turn, "step": step, "message": {
            "id": self.message_id("a"), "role": "assistant", "content": blocks,
            "source": {"kind": "model", "provider": "deepseek", "model": self.model}}}
        if finish is not None:
            data["usage"] = usage
        if interrupted:
            data["message"]["content"] = [b for b in blocks if b["type"] != "tool-call"]
            data["interrupted"] = True
        self.append("assistant/message", data, surface_op="append", source_event_seqs=sources)
        return call_ids

    def run_tools(self, turn: int, step: int, call_ids: list[str]) -> None:
        rng = self.rng
        calls = {}
        for call_id in call_ids:
            calls[call_id] = self.append("tool/call", {"turn": turn, "step": step, "callId": call_id, "name": "bash",
                                                       "arguments": "{}"}).seq
        for call_id in rng.sample(call_ids, len(call_ids)):  # results arrive in any order
            if rng.random() < self.config.big_result_probability:
                size = rng.randint(*self.config.big_result_bytes)
                output = ("".join(self.words(200, 200)) * (size // 800 + 1))[:size]
            else:
                output = "".join(self.words(5, 120))
            data = {"turn": turn, "step": step, "message": {
                "id": self.message_id("t"), "role": "user", "source": {"kind": "tool", "callId": call_id},
                "content": [{"type": "tool-result", "toolCallId": call_id,
                             "content": [{"type": "text", "text": output}], "isError": rng.random() < 0.1}]}}
            result = self.append("tool/result", data, surface_op="append", source_event_seqs=[calls[call_id]])
            if len(output) > 2000 or rng.random() < 0.05:  # trim it for the model
                trimmed = thaw(result.data)
                trimmed["message"]["content"][0]["content"] = [{"type": "text", "text": output[:200] + "…[trimmed]"}]
                self.append("tool/result", trimmed, surface_op={"op": "replace", "start": result.seq, "end": result.seq},
                            source_event_seqs=[result.seq])

    def compact(self) -> None:
        nodes = list(self.log.surface_nodes)
        keep = self.rng.randint(1, 3)
        shadowed = nodes[:-keep] if len(nodes) > keep else nodes[:1]
        compaction_id = self.message_id("c")
        self.append("compaction/start", {"compactionId": compaction_id, "turn": None})
        summary = self.append("compaction/summary", {"compactionId": compaction_id, "summary": "Earlier work, summarized.",
                                                     "shadowedSeqs": shadowed})
        self.append("user/message", {"id": self.message_id("s"), "role": "user",
                                     "content": [{"type": "text", "text": "Summary of earlier work."}],
                                     "source": {"kind": "plugin", "plugin": "compaction", "form": "relay"}},
                    surface_op={"op": "replace", "start": shadowed[0], "end": shadowed[-1]},
                    source_event_seqs=shadowed + [summary.seq])
        self.append("compaction/end", {"compactionId": compaction_id, "turn": None})


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
    agent = _Agent(session_id, config, faults, rng)
    return agent.truth, agent.run()
