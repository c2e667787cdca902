"""dsh's v1→v2 edge: assistant chunks folded into the stream of their message.

Every ``assistant/chunk`` event and packed chunk row of one attempt (its
``turn``/``step``) becomes one ``stream`` (packed as dsh packs it: runs of
deltas of one block, raw ``chunk`` records otherwise). The
``assistant/message`` whose ``sourceEventSeqs`` name exactly those chunks
gets it as ``data.stream`` (and loses the references); chunks no message
claims become an ``assistant/attempt``. Events that arrive inside an attempt
wait: they come out before its message, after an unclaimed attempt. Seqs
are renumbered densely and every seq reference remapped; a reference to a
chunk is refused. A turn left open before a queued next-turn splice gets
its ``turn/end {interrupted}``; a legacy goal message (a goal source that
carries its ``change``) becomes that ``goal/change`` and the message with
the goal plugin's source; a seeded log gets its inherited
``session/end-seed`` marker at the cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import FormatUnsupportedError
from ..jsonvalue import MAX_SAFE_INTEGER, encode_json
from .v0_checks.values import refusal

__all__ = ["ChunkRun", "V1ToV2"]

EDGE = "@deepseek-ai/dsh-session-format-v1-to-v2"
Emit = Callable[[dict[str, Any]], None]
_CLOSERS = frozenset({"turn/end", "step/end", "llm/retry", "llm/retry-started"})
_DELTAS = {"text-delta": "text-chunks", "reasoning-delta": "reasoning-chunks"}


@dataclass
class ChunkRun:
    """A packed chunk row as v0 stores it, kept whole (``stream`` is its stream record)."""

    first_seq: int
    count: int
    turn: int
    step: int
    last_time: int
    stream: dict[str, Any]


@dataclass
class _Attempt:
    turn: Any
    step: Any
    spans: list[list[int]] = field(default_factory=list)  # [first seq, count]
    stream: list[list[Any]] = field(default_factory=list)  # [record, last time]
    chunks: int = 0
    terminal: bool = False
    pending_chunks: list[list[Any]] = field(default_factory=list)  # accumulator records [record, last time]
    last_seq: int = 0
    last_time: int = 0


def _safe(value: Any) -> bool:
    return type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


class V1ToV2:
    """The edge over one log: :meth:`event` / :meth:`run` in stored order, then :meth:`finish`."""

    def __init__(self, header: dict[str, Any], cut: int, emit: Emit) -> None:
        self.header = header
        self.seeded = header["isSeeded"]
        self.source_cut = cut
        self.emit_out = emit
        self.mapping: dict[int, int] = {}
        self.open_turn: Any = None
        self.open_step: Any = None
        self.previous: dict[str, Any] | None = None
        self.pending: tuple[_Attempt, list[dict[str, Any]]] | None = None
        self.target = 0
        self.target_cut: int | None = None if self.seeded else 0
        self.last_time = header["createdAt"]

    # ----------------------------------------------------------- input

    def event(self, event: dict[str, Any]) -> None:
        event_type, seq, data = event["type"], event["seq"], event["data"]
        interrupted = self._interrupted(event)
        if event_type == "turn/start" and self.open_turn is not None and interrupted is None:
            raise FormatUnsupportedError(f"turn/start {_js(data.get('turn'))} does not close the prior turn")
        self._observe(event)
        self.last_time = event["time"]
        if interrupted is not None:
            self._finish_attempt()
            self._generated(seq, interrupted)
        source = data.get("source") if event_type == "user/message" else None
        if isinstance(source, dict) and source.get("kind") == "goal" and "change" in source:
            # a legacy goal message: its change becomes a goal/change, the message the goal plugin's
            self._generated(seq, {"type": "goal/change", "seq": seq, "time": event["time"], "data": source["change"]})
            self._source({**event, "data": {**data, "source": {"kind": "plugin", "plugin": "goal"}}})
        elif event_type == "assistant/chunk":
            self._chunk(event)
        elif event_type == "assistant/message":
            self._message(event)
        elif event_type in _CLOSERS:
            self._finish_attempt()
            self._source(event)
        elif self.pending is not None:
            self.pending[1].append(event)
        else:
            self._source(event)

    def run(self, run: ChunkRun) -> None:
        self.previous = None
        self.last_time = run.last_time
        attempt = self._join(run.turn, run.step)
        if (run.first_seq < self.source_cut) != (run.first_seq + run.count - 1 < self.source_cut):
            raise FormatUnsupportedError(f"inherited Session cut {self.source_cut} splits one Assistant attempt")
        self._flush_accumulator(attempt)
        self._append_record(attempt, dict(run.stream), run.last_time)
        self._span(attempt, run.first_seq, run.count, run.last_time)

    def finish(self) -> int:
        """End of the log; returns the target's inherited cut."""
        self._finish_attempt()
        if self.seeded and self.target_cut is None:
            self.target_cut = self.target
            self._put({"type": "session/end-seed", "seq": self.target, "time": self.last_time,
                       "data": {"inherited": True}})
        assert self.target_cut is not None, "an unseeded log's cut is 0 from the start"
        return self.target_cut

    # ------------------------------------------------------------ turns

    def _interrupted(self, event: dict[str, Any]) -> dict[str, Any] | None:
        previous = self.previous
        if (event["type"] != "turn/start" or self.open_turn is None or self.open_step is not None
                or not _safe(self.open_turn) or event["data"].get("turn") != self.open_turn + 1
                or previous is None or previous["type"] != "agent/inbox/spliced"):
            return None
        spliced = previous["data"]
        if spliced.get("target") != "next-turn" or not isinstance(spliced.get("inserted"), list) \
                or not spliced["inserted"]:
            return None
        return {"type": "turn/end", "seq": event["seq"], "time": event["time"],
                "data": {"turn": self.open_turn, "reason": {"kind": "interrupted"}}}

    def _observe(self, event: dict[str, Any]) -> None:
        event_type, data = event["type"], event["data"]
        if event_type == "turn/start":
            self.open_turn, self.open_step = data.get("turn"), None
        elif event_type == "turn/end":
            self.open_turn = self.open_step = None
        elif event_type == "step/start":
            self.open_step = data.get("step")
        elif event_type == "step/end":
            self.open_step = None
        self.previous = event

    # ----------------------------------------------------------- chunks

    def _join(self, turn: Any, step: Any) -> _Attempt:
        """The attempt a chunk of ``turn``/``step`` belongs to (a new one after a finish or another step)."""
        if self.pending is not None:
            attempt = self.pending[0]
            if attempt.terminal or attempt.turn != turn or attempt.step != step:
                self._finish_attempt()
            else:
                self._flush_waiting()
        if self.pending is None:
            self.pending = (_Attempt(turn, step), [])
        return self.pending[0]

    def _chunk(self, event: dict[str, Any]) -> None:
        data = event["data"]
        attempt = self._join(data.get("turn"), data.get("step"))
        self._check_cut(attempt, event["seq"])
        self._accumulate(attempt, event["time"], data.get("chunk"))
        self._span(attempt, event["seq"], 1, event["time"])
        if isinstance(data.get("chunk"), dict) and data["chunk"].get("type") == "finish":
            attempt.terminal = True

    def _check_cut(self, attempt: _Attempt, member: int) -> None:
        first = attempt.spans[0][0] if attempt.spans else member
        if (first < self.source_cut) != (member < self.source_cut):
            raise FormatUnsupportedError(f"inherited Session cut {self.source_cut} splits one Assistant attempt")

    @staticmethod
    def _span(attempt: _Attempt, first: int, count: int, last_time: int) -> None:
        if attempt.spans and attempt.spans[-1][0] + attempt.spans[-1][1] == first:
            attempt.spans[-1][1] += count
        else:
            attempt.spans.append([first, count])
        attempt.chunks += count
        attempt.last_seq, attempt.last_time = first + count - 1, last_time

    @staticmethod
    def _accumulate(attempt: _Attempt, time: Any, chunk: Any) -> None:
        """dsh's ``AssistantStreamAccumulator.push``: deltas of one block join a run
        (its errors are not format errors, so the edge wraps them)."""
        if not _safe(time):
            raise refusal(f"Assistant stream time must be a safe integer, got {_js(time)}", EDGE, 1)
        if not isinstance(chunk, dict) or type(chunk.get("type")) is not str:
            raise refusal(f"unreachable variant in AssistantStreamAccumulator.push: {_js(chunk)}", EDGE, 1)
        kind = chunk["type"]
        records = attempt.pending_chunks
        last = records[-1] if records else None
        if kind in _DELTAS:
            run_type, index, text = _DELTAS[kind], chunk.get("index"), chunk.get("text")
            if type(index) is not int or index < 0:
                raise refusal(f"{kind} index must be a non-negative safe integer", EDGE, 1)
            if type(text) is not str:
                raise refusal(f"{kind} text must be a string", EDGE, 1)
            if last is not None and last[0]["type"] == run_type and last[0]["index"] == index \
                    and _safe(time - last[1]):
                last[0]["dt"].append(time - last[1])
                last[0]["texts"].append(text)
                last[1] = time
            else:
                records.append([{"type": run_type, "time0": time, "index": index, "dt": [], "texts": [text]}, time])
        elif kind == "tool-call-delta":
            index, call_id, delta = chunk.get("index"), chunk.get("id"), chunk.get("argumentsDelta")
            if type(index) is not int or index < 0:
                raise refusal("tool-call-delta index must be a non-negative safe integer", EDGE, 1)
            if type(call_id) is not str or ("name" in chunk and type(chunk["name"]) is not str) \
                    or type(delta) is not str:
                raise refusal("tool-call-delta id, name and argumentsDelta must be strings", EDGE, 1)
            if call_id == "" or chunk.get("name") == "":
                records.append([{"type": "chunk", "time": time, "chunk": chunk}, time])
                return
            same = (last is not None and last[0]["type"] == "tool-call-chunks" and last[0]["index"] == index
                    and last[0]["id"] == call_id and ("name" in last[0]) == ("name" in chunk)
                    and last[0].get("name") == chunk.get("name") and _safe(time - last[1]))
            if same and last is not None:
                last[0]["dt"].append(time - last[1])
                last[0]["args"].append(delta)
                last[1] = time
            else:
                record = {"type": "tool-call-chunks", "time0": time, "index": index, "dt": [], "id": call_id}
                if "name" in chunk:
                    record["name"] = chunk["name"]
                record["args"] = [delta]
                records.append([record, time])
        elif kind in ("block-start", "block-end", "usage", "finish"):
            records.append([{"type": "chunk", "time": time, "chunk": chunk}, time])
        else:
            raise refusal(f"unreachable variant in AssistantStreamAccumulator.push: {_js(chunk)}", EDGE, 1)

    def _flush_accumulator(self, attempt: _Attempt) -> None:
        for record, last_time in attempt.pending_chunks:
            self._append_record(attempt, record, last_time)
        attempt.pending_chunks = []

    @staticmethod
    def _append_record(attempt: _Attempt, record: dict[str, Any], last_time: int) -> None:
        """dsh's ``appendStreamRecord``: a run continues the stream's last run of its block."""
        prev = attempt.stream[-1] if attempt.stream else None
        if prev is None or record["type"] == "chunk" or prev[0]["type"] != record["type"]:
            attempt.stream.append([record, last_time])
            return
        gap = record["time0"] - prev[1]
        if prev[0]["index"] != record["index"] or not _safe(gap) or (
                record["type"] == "tool-call-chunks" and (prev[0]["id"] != record["id"]
                                                          or prev[0].get("name") != record.get("name")
                                                          or ("name" in prev[0]) != ("name" in record))):
            attempt.stream.append([record, last_time])
            return
        key = "args" if record["type"] == "tool-call-chunks" else "texts"
        merged = dict(prev[0])
        merged["dt"] = [*prev[0]["dt"], gap, *record["dt"]]
        merged[key] = [*prev[0][key], *record[key]]
        prev[0], prev[1] = merged, last_time

    def _stream(self, attempt: _Attempt) -> list[dict[str, Any]]:
        self._flush_accumulator(attempt)
        return [record for record, _ in attempt.stream]

    def _message(self, event: dict[str, Any]) -> None:
        data, seq = event["data"], event["seq"]
        sources = event.get("sourceEventSeqs")
        if self.pending is not None and (self.pending[0].turn != data.get("turn")
                                         or self.pending[0].step != data.get("step")):
            self._finish_attempt()
            self._source(self._with_stream(event, []))
            return
        if not isinstance(sources, list):
            if self.pending is not None:
                raise FormatUnsupportedError(f"assistant/message {seq} does not cite its complete v1 chunk attempt")
            self._source(self._with_stream(event, []))
            return
        if not sources:
            self._finish_attempt()
            self._source(self._with_stream(event, []))
            return
        if self.pending is None or not self._cites(self.pending[0], sources):
            raise FormatUnsupportedError(f"assistant/message {seq} chunk references are not one complete ordered "
                                         "attempt")
        attempt = self.pending[0]
        self._check_cut(attempt, seq)
        attempt.terminal = True
        self._flush_waiting()
        self.pending = None
        self._source(self._with_stream(event, self._stream(attempt)))

    @staticmethod
    def _cites(attempt: _Attempt, sources: list[Any]) -> bool:
        expected = [seq for first, count in attempt.spans for seq in range(first, first + count)]
        return sources == expected and all(type(s) is int for s in sources)

    @staticmethod
    def _with_stream(event: dict[str, Any], stream: list[dict[str, Any]]) -> dict[str, Any]:
        out = {key: value for key, value in event.items() if key != "sourceEventSeqs"}
        out["data"] = {**event["data"], "stream": stream}
        return out

    def _finish_attempt(self) -> None:
        if self.pending is None:
            return
        attempt, _ = self.pending
        self._generated(attempt.last_seq, {"type": "assistant/attempt", "seq": attempt.last_seq, "time": attempt.last_time,
                                         "data": {"turn": attempt.turn, "step": attempt.step,
                                                  "stream": self._stream(attempt)}})
        self._flush_waiting()
        self.pending = None

    def _flush_waiting(self) -> None:
        if self.pending is None:
            return
        waiting = self.pending[1]
        while waiting:
            self._source(waiting.pop(0))

    # --------------------------------------------------------- emission

    def _source(self, event: dict[str, Any]) -> None:
        if self.seeded and event["seq"] == self.source_cut and event["type"] == "session/end-seed":
            event = {**event, "data": {"inherited": True}}
        self._cut_before(event["seq"], event["time"], event["type"])
        self.mapping[event["seq"]] = self.target
        self._put(self._remap(event))

    def _generated(self, origin: int, event: dict[str, Any]) -> None:
        self._cut_before(origin, event["time"], event["type"])
        self._put(self._remap(event))

    def _cut_before(self, origin: int, time: int, event_type: str) -> None:
        if not self.seeded or self.target_cut is not None or origin < self.source_cut:
            return
        self.target_cut = self.target
        if origin == self.source_cut and event_type == "session/end-seed":
            return
        self._put({"type": "session/end-seed", "seq": self.target, "time": time, "data": {"inherited": True}})

    def _put(self, event: dict[str, Any]) -> None:
        event["seq"] = self.target
        self.target += 1
        self.emit_out(event)

    def _map(self, value: Any, label: str) -> int:
        mapped = self.mapping.get(value) if type(value) is int else None
        if mapped is None:
            raise FormatUnsupportedError(f"{label} targets consumed assistant/chunk {_js(value)}")
        return mapped

    def _remap(self, event: dict[str, Any]) -> dict[str, Any]:
        event_type, seq = event["type"], event["seq"]
        out = {key: value for key, value in event.items() if key not in ("sourceEventSeqs", "surfaceOp")}
        sources = event.get("sourceEventSeqs")
        if sources is not None:
            sources = [self._map(s, f"{event_type} {seq} sources") for s in sources]
        op = event.get("surfaceOp")
        if op is not None and op != "append":
            op = op if isinstance(op, dict) else {}  # dsh reads members of any other value as undefined
            op = {"op": "replace", "start": self._map(op.get("start"), f"{event_type} {seq} surface start"),
                  "end": self._map(op.get("end"), f"{event_type} {seq} surface end")}
        out["data"] = self._remap_payload(event_type, seq, event["data"])
        if sources is not None:
            out["sourceEventSeqs"] = sources
        if op is not None:
            out["surfaceOp"] = op
        return out

    def _remap_payload(self, event_type: str, seq: int, data: Any) -> Any:
        if event_type == "command/done" and "sourceEventSeq" in data:
            return {**data, "sourceEventSeq": self._map(data["sourceEventSeq"], f"{event_type} {seq} sourceEventSeq")}
        if event_type in ("compaction/prune", "compaction/summary"):
            span = data["shadowedRange"]
            return {**data, "shadowedRange": {
                "start": self._map(span.get("start"), f"{event_type} {seq} shadowedRange start"),
                "end": self._map(span.get("end"), f"{event_type} {seq} shadowedRange end")},
                "shadowedSeqs": [self._map(s, f"{event_type} {seq} shadowedSeqs") for s in data["shadowedSeqs"]]}
        if event_type in ("session/title", "session/title-llm-request") and isinstance(data.get("messageSeqs"), list):
            return {**data, "messageSeqs": [self._map(s, f"{event_type} {seq} messageSeqs") for s in data["messageSeqs"]]}
        return data


def _js(value: Any) -> str:
    """``JSON.stringify`` of a decoded value, for messages."""
    return encode_json(value).decode()
