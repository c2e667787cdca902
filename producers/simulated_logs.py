"""The session log a simulated agent writes, in each published dsh format.

The agent (:mod:`producers.simulator`) says what happens: a user message,
an answer streamed block by block, a failed attempt, a retry, a tool call
and its result, a trimmed result, a compaction. A log writes each as the
dsh release of its format does:

* **v0** (dsh 0.1.0-0.1.2): every stream chunk is an event, stored as
  packed rows; the system prompt sits in the request header; a tool result
  is a user message with one ``tool-result`` block.
* **v4** (dsh 0.2.1): the stream is embedded in ``assistant/message``, a
  failed request is an ``assistant/attempt``, the system prompt is the
  ``system/message`` heading the surface, a tool result is a tool-role
  message, replaces name ``startSeq``/``endSeq``.
* **v3** (dsh 0.1.5): v4's stream model with v3's message shapes (tool
  results wrapped as in v0, runtime messages naming their plugin).

Every event is folded at once by ``dsh_core``'s reader of that format (the
one every consumer opens), so an event the format refuses fails the
simulation where it is written; the fold's derived messages and request
header are what the agent's attestations digest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from msgspec import UNSET

from dsh_core.folds import open_fold, opened_state
from dsh_core.session import SessionLog
from dsh_core.session_header import SessionHeader
from dsh_kafka.records import SessionRecord, record_from_line, records_for_batch, writer_of
from dsh_core.jsonvalue import encode_json

__all__ = ["FORMATS", "Block", "SimulatedLog", "V0Log", "V4Log", "open_log"]

#: The format versions a fleet can be simulated in.
FORMATS = (0, 3, 4)


@dataclass(frozen=True)
class Block:
    """One content block of an answer and the deltas it streamed in."""

    kind: str  # "text", "reasoning" or "tool-call"
    pieces: tuple[str, ...]
    call_id: str = ""
    name: str = ""

    @property
    def content(self) -> dict[str, Any]:
        if self.kind == "tool-call":
            return {"type": "tool-call", "id": self.call_id, "name": self.name, "arguments": "".join(self.pieces)}
        return {"type": self.kind, "text": "".join(self.pieces)}


def _tool_result_wrapped(message_id: str, call_id: str, text: str, is_error: bool) -> dict[str, Any]:
    """v0's and v3's tool result: a user message holding one result block."""
    return {"id": message_id, "role": "user", "source": {"kind": "tool", "callId": call_id},
            "content": [{"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}],
                         "isError": is_error}]}


class SimulatedLog(Protocol):
    """What the agent writes through (both formats' logs are one)."""

    version: int
    provider: str
    header: SessionHeader

    @property
    def session_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def surface_nodes(self) -> tuple[int, ...]: ...
    @property
    def compactable(self) -> tuple[int, ...]: ...
    def messages(self) -> list[Any]: ...
    def request_header(self) -> Any: ...
    def append(self, event_type: str, data: Any, *, surface_op: Any = UNSET, sources: Any = UNSET,
               ignorable: bool = False, refused: bool = False) -> int: ...
    def take_records(self) -> list[SessionRecord]: ...
    def replace(self, start: int, end: int) -> dict[str, Any]: ...
    def begin_step(self, turn: int, step: int, system: str) -> None: ...
    def request_header_value(self, config: dict[str, Any], system: str, tools: list[Any]) -> dict[str, Any]: ...
    def runtime_context_source(self, sections: list[dict[str, str]]) -> dict[str, Any]: ...
    def tool_result_message(self, message_id: str, call_id: str, text: str, is_error: bool) -> dict[str, Any]: ...
    def answer(self, turn: int, step: int, message: dict[str, Any], blocks: list[Block], usage: dict[str, Any],
               finish: str | None, interrupted: bool) -> None: ...
    def failed_attempt(self, turn: int, step: int, failure: dict[str, Any]) -> None: ...
    def retry(self, turn: int, step: int, retry_id: str, failure: dict[str, Any]) -> None: ...
    def compaction(self, compaction_id: str, shadowed: list[int], message_id: str) -> None: ...


class V0Log:
    """A v0 session log, written and folded by :class:`SessionLog`."""

    version = 0
    provider = "deepseek"

    def __init__(self, session_id: str, created_at: int, cwd: str, clock: Callable[[], int]) -> None:
        self.header = SessionHeader(id=session_id, createdAt=created_at, cwd=cwd, delegationDepth=0)
        self._log = SessionLog(session_id, header=self.header, clock=clock)
        self._pending: list[Any] = []

    # ------------------------------------------------------------ the log

    @property
    def session_id(self) -> str:
        return self._log.session_id

    @property
    def seq(self) -> int:
        return self._log.seq

    @property
    def surface_nodes(self) -> tuple[int, ...]:
        return self._log.surface_nodes

    @property
    def compactable(self) -> tuple[int, ...]:
        """The surface nodes a compaction may shadow."""
        return self._log.surface_nodes

    def messages(self) -> list[Any]:
        return self._log.derive_messages()

    def request_header(self) -> Any:
        return self._log.request_header()

    def append(self, event_type: str, data: Any, *, surface_op: Any = UNSET, sources: Any = UNSET,
               ignorable: bool = False, refused: bool = False) -> int:
        """Append one event (``refused``: one the format must refuse); its seq."""
        event = self._log.append(event_type, data, surface_op=surface_op, source_event_seqs=sources,
                                 ignorable=ignorable)
        self._pending.append(event)
        return event.seq

    def take_records(self) -> list[SessionRecord]:
        """The records of what was appended since the last call (one append batch)."""
        records = records_for_batch(self.session_id, self._pending, writer=writer_of(self.header))
        self._pending = []
        return records

    # ------------------------------------------------------- what it says

    def replace(self, start: int, end: int) -> dict[str, Any]:
        return {"op": "replace", "start": start, "end": end}

    def begin_step(self, turn: int, step: int, system: str) -> None:
        """v0 carries the system prompt in the request header."""

    def request_header_value(self, config: dict[str, Any], system: str, tools: list[Any]) -> dict[str, Any]:
        return {"config": config, "system": system, "tools": tools}

    def runtime_context_source(self, sections: list[dict[str, str]]) -> dict[str, Any]:
        return {"kind": "plugin", "plugin": "context", "form": "snapshot", "sections": sections}

    def tool_result_message(self, message_id: str, call_id: str, text: str, is_error: bool) -> dict[str, Any]:
        return _tool_result_wrapped(message_id, call_id, text, is_error)

    def answer(self, turn: int, step: int, message: dict[str, Any], blocks: list[Block], usage: dict[str, Any],
               finish: str | None, interrupted: bool) -> None:
        """Each chunk an event, then the ``assistant/message`` naming them."""
        sources = []

        def chunk(body: dict[str, Any]) -> None:
            sources.append(self.append("assistant/chunk", {"turn": turn, "step": step, "chunk": body}))

        for index, block in enumerate(blocks):
            chunk({"type": "block-start", "index": index, "blockType": block.kind})
            for number, piece in enumerate(block.pieces):
                if block.kind == "tool-call":
                    delta = {"type": "tool-call-delta", "index": index, "id": block.call_id}
                    if number == 0:
                        delta["name"] = block.name
                    chunk({**delta, "argumentsDelta": piece})
                else:
                    chunk({"type": f"{block.kind}-delta", "index": index, "text": piece})
            chunk({"type": "block-end", "index": index, "block": block.content})
        data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
        if finish is not None:
            chunk({"type": "usage", "usage": usage})
            chunk({"type": "finish", "reason": {"kind": finish}})
            data["usage"] = usage
        if interrupted:
            data["interrupted"] = True
        self.append("assistant/message", data, surface_op="append", sources=sources)

    def failed_attempt(self, turn: int, step: int, failure: dict[str, Any]) -> None:
        self.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {
            "type": "finish", "reason": {"kind": "error", "failure": failure}}})

    def retry(self, turn: int, step: int, retry_id: str, failure: dict[str, Any]) -> None:
        _retry(self, turn, step, retry_id, failure)

    def compaction(self, compaction_id: str, shadowed: list[int], message_id: str) -> None:
        _compaction(self, compaction_id, shadowed, message_id,
                    {"kind": "plugin", "plugin": "compact", "compactionId": compaction_id})


class V4Log:
    """A v4 (or v3) session log: JSONL lines, each folded as it is written."""

    provider = "deepseek-official"

    def __init__(self, session_id: str, created_at: int, cwd: str, clock: Callable[[], int],
                 version: int = 4) -> None:
        self.version = version
        self.header = SessionHeader(id=session_id, createdAt=created_at, version=version, cwd=cwd,
                                    delegationDepth=0, isSeeded=False)
        self._fold = open_fold(self.header.to_line(), f"simulated session {session_id!r}")
        self._clock = clock
        self._pending_lines: list[bytes] = []
        self._system_written = False

    @property
    def session_id(self) -> str:
        return self.header.id

    @property
    def seq(self) -> int:
        return self._fold.count

    @property
    def surface_nodes(self) -> tuple[int, ...]:
        return tuple(opened_state(self._fold).surface.nodes)

    @property
    def compactable(self) -> tuple[int, ...]:
        """The surface after its system head, which nothing but a new system prompt may replace."""
        return self.surface_nodes[1:] if self._system_written else self.surface_nodes

    def messages(self) -> list[Any]:
        return opened_state(self._fold).messages()

    def request_header(self) -> Any:
        return opened_state(self._fold).header

    def append(self, event_type: str, data: Any, *, surface_op: Any = UNSET, sources: Any = UNSET,
               ignorable: bool = False, refused: bool = False) -> int:
        seq = self._fold.count
        event: dict[str, Any] = {"type": event_type, "seq": seq, "time": self._clock(), "data": data}
        if ignorable:
            event["ignorable"] = True
        if surface_op is not UNSET:
            event["surfaceOp"] = surface_op
        if sources is not UNSET:
            event["sourceEventSeqs"] = sources
        line = encode_json(event)
        self._fold.apply(line)
        if (self._fold.error is None) == refused:
            raise AssertionError(f"simulated v{self.version} {event_type} at seq {seq}: the fold says "
                                 f"{self._fold.error}, expected {'a' if refused else 'no'} refusal")
        self._pending_lines.append(line)
        return seq

    def take_records(self) -> list[SessionRecord]:
        writer = writer_of(self.header)
        records = [record_from_line(self.session_id, line, self.version, writer) for line in self._pending_lines]
        self._pending_lines = []
        return records

    # ------------------------------------------------------- what it says

    def replace(self, start: int, end: int) -> dict[str, Any]:
        return {"op": "replace", "startSeq": start, "endSeq": end}

    def _plugin(self, v4_kind: str, v3_plugin: str, **rest: Any) -> dict[str, Any]:
        """A runtime message's source: its producer's kind (v4) or its plugin (v3)."""
        head = {"kind": v4_kind} if self.version == 4 else {"kind": "plugin", "plugin": v3_plugin}
        return {**head, **rest}

    def begin_step(self, turn: int, step: int, system: str) -> None:
        """The session's first step opens with the system prompt, the surface's head."""
        if self._system_written:
            return
        self._system_written = True
        self.append("system/message", {"turn": turn, "step": step, "message": {
            "id": f"system-{self.session_id[-6:]}", "role": "system",
            "source": self._plugin("system-prompt", "@deepseek-ai/dsh-system-prompt"),
            "content": [{"type": "text", "text": system}]}}, surface_op="append")

    def request_header_value(self, config: dict[str, Any], system: str, tools: list[Any]) -> dict[str, Any]:
        return {"config": config, "tools": tools}

    def runtime_context_source(self, sections: list[dict[str, str]]) -> dict[str, Any]:
        return self._plugin("runtime-context", "@deepseek-ai/dsh-system-prompt", form="snapshot", sections=sections)

    def tool_result_message(self, message_id: str, call_id: str, text: str, is_error: bool) -> dict[str, Any]:
        if self.version == 3:
            return _tool_result_wrapped(message_id, call_id, text, is_error)
        return {"id": message_id, "role": "tool", "source": {"kind": "tool", "callId": call_id},
                "toolCallId": call_id, "content": [{"type": "text", "text": text}], "isError": is_error}

    def answer(self, turn: int, step: int, message: dict[str, Any], blocks: list[Block], usage: dict[str, Any],
               finish: str | None, interrupted: bool) -> None:
        """One ``assistant/message`` with the stream it assembled from, packed as dsh packs it."""
        time = self._clock()
        stream: list[dict[str, Any]] = []
        for index, block in enumerate(blocks):
            stream.append({"type": "chunk", "time": time, "chunk": {"type": "block-start", "index": index,
                                                                    "blockType": block.kind}})
            dt = [1] * (len(block.pieces) - 1)
            if block.kind == "tool-call":
                stream.append({"type": "tool-call-chunks", "time0": time, "index": index, "dt": [],
                               "id": block.call_id, "name": block.name, "args": [block.pieces[0]]})
                if len(block.pieces) > 1:
                    stream.append({"type": "tool-call-chunks", "time0": time, "index": index, "dt": dt[1:],
                                   "id": block.call_id, "args": list(block.pieces[1:])})
            else:
                stream.append({"type": f"{block.kind}-chunks", "time0": time, "index": index, "dt": dt,
                               "texts": list(block.pieces)})
            stream.append({"type": "chunk", "time": time, "chunk": {"type": "block-end", "index": index,
                                                                    "block": block.content}})
        data: dict[str, Any] = {"turn": turn, "step": step, "message": message}
        if finish is not None:
            stream.append({"type": "chunk", "time": time, "chunk": {"type": "usage", "usage": usage}})
            stream.append({"type": "chunk", "time": time, "chunk": {"type": "finish", "reason": {"kind": finish}}})
            data["usage"] = usage
        if interrupted:
            data["interrupted"] = True
        data["stream"] = stream
        self.append("assistant/message", data, surface_op="append")

    def failed_attempt(self, turn: int, step: int, failure: dict[str, Any]) -> None:
        self.append("assistant/attempt", {"turn": turn, "step": step, "stream": [
            {"type": "chunk", "time": self._clock(), "chunk": {"type": "finish",
                                                              "reason": {"kind": "error", "failure": failure}}}]})

    def retry(self, turn: int, step: int, retry_id: str, failure: dict[str, Any]) -> None:
        _retry(self, turn, step, retry_id, failure)

    def compaction(self, compaction_id: str, shadowed: list[int], message_id: str) -> None:
        _compaction(self, compaction_id, shadowed, message_id,
                    self._plugin("compact-checkpoint", "compact", compactionId=compaction_id))


def _retry(log: SimulatedLog, turn: int, step: int, retry_id: str, failure: dict[str, Any]) -> None:
    """A retry after a failed attempt, as dsh 0.1.2 and later log it."""
    log.append("llm/retry", {"retryId": retry_id, "turn": turn, "step": step, "provider": log.provider,
                             "mode": "normal", "policyKey": "normal", "retry": 1, "maxRetries": 5, "delayMs": 100,
                             "failure": failure})
    log.append("llm/retry-started", {"retryId": retry_id, "turn": turn, "step": step, "retry": 1})


def _compaction(log: SimulatedLog, compaction_id: str, shadowed: list[int], message_id: str,
                checkpoint: dict[str, Any]) -> None:
    """A compaction between turns: its summary of the ``shadowed`` surface
    span, and the checkpoint message (with source ``checkpoint``) replacing it."""
    start = log.append("compaction/start", {"compactionId": compaction_id, "turn": None})
    text = [{"type": "text", "text": "Earlier work, summarized."}]
    summary = log.append("compaction/summary", {
        "compactionId": compaction_id, "summary": text, "rawOutput": text, "llmStreamCall": True,
        "shadowedRange": {"start": shadowed[0], "end": shadowed[-1]}, "shadowedSeqs": shadowed,
        "shadowedTokenCount": 100 * len(shadowed), "provider": log.provider, "model": "deepseek-flash",
        "maxTokens": 8192, "usage": {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120}})
    log.append("user/message", {"id": message_id, "role": "user", "content": text, "source": checkpoint},
               surface_op=log.replace(shadowed[0], shadowed[-1]), sources=[start, summary, *shadowed])
    log.append("compaction/end", {"compactionId": compaction_id, "turn": None})


def open_log(version: int, session_id: str, created_at: int, cwd: str, clock: Callable[[], int]) -> SimulatedLog:
    """A new simulated session log of format ``version`` (one of :data:`FORMATS`)."""
    if version == 0:
        return V0Log(session_id, created_at, cwd, clock)
    if version in (3, 4):
        return V4Log(session_id, created_at, cwd, clock, version)
    raise ValueError(f"no simulated format v{version}; formats are {', '.join(map(str, FORMATS))}")
