"""dsh's v0 codec and v0→v1 edge: a stored v0 row as dsh 0.2.1 migrates it.

Rows decode as dsh's released v0 codec decodes them: a packed chunk row
stays whole (:class:`~.v1_to_v2.ChunkRun`), an event's range-encoded
``sourceEventSeqs`` expand. The edge then normalizes each event in dsh's
order, with dsh 0.2.1's own checks and texts — ``compact/*`` renamed,
retired ``request/header-delta``/``mode/set`` and the ``fallback`` header
reason refused, a pre-react-loop ``turn/start`` and ``turn/end`` upgraded,
``messagePrefix`` dropped, steering turned into a user message, retries
and compactions without ids given dsh's legacy ids, messages stored before
ids wrapped (a replacing legacy tool result takes the id of the message it
replaces) — and checks every event but ``assistant/chunk`` against dsh's
frozen v0 inventory (:mod:`.v0_checks.inventory`: the member sets, then every
nested per-type check).
"""

from __future__ import annotations

from typing import Any

from ..errors import DshError, FormatUnsupportedError
from ..jsonvalue import encode_json, is_safe_int
from ..formats.v0.legacy import legacy_message_id
from ..formats.v4.rows import decode_seq_ranges
from .v0_checks.inventory import check_payload
from .v0_checks.values import count, keys, record, refusal
from .v1_to_v2 import ChunkRun

__all__ = ["V0ToV1", "decode_v0_row", "refusal"]

_PLAIN_ENDS = ("completed", "blocked", "max-tokens", "interrupted")
_PACKED = frozenset({"text-chunks", "reasoning-chunks", "tool-call-chunks"})
_RENAMED = {"compact/start": "compaction/start", "compact/summary": "compaction/summary",
            "compact/end": "compaction/end", "compact/prune": "compaction/prune"}

def _js(value: Any) -> str:
    return encode_json(value).decode()


def _count(value: Any, label: str) -> int:
    if type(value) is not int or value < 0:
        raise refusal(f"{label} must be a non-negative safe integer")
    return value


def decode_v0_row(value: Any, row: int) -> dict[str, Any] | ChunkRun:
    """One stored v0 row as dsh's released v0 codec decodes it (raises
    :class:`DshError` for a malformed row)."""
    if not isinstance(value, dict):
        raise refusal(f"released Session row {row} must be a JSON object")
    kind = value.get("type")
    if type(kind) is str and kind in _PACKED:
        return _decode_run(value, kind, row)
    if "sourceEventSeqs" in value:
        seq = _count(value.get("seq"), f"released Session row {row} seq")
        try:
            sources = decode_seq_ranges(value["sourceEventSeqs"], seq)
        except DshError as error:
            raise refusal(error.message) from None
        return {**value, "sourceEventSeqs": sources}
    return value


def _decode_run(row: dict[str, Any], kind: str, number: int) -> ChunkRun:
    label = f"released {kind} row {number}"
    if set(row) != {"type", "seq0", "time0", "data"} or not isinstance(row.get("data"), dict):
        raise refusal(f"{label} must hold exactly type, seq0, time0 and an object data")
    data, tool = row["data"], kind == "tool-call-chunks"
    payload = data.get("args" if tool else "texts")
    if not isinstance(payload, list) or not payload or any(type(p) is not str for p in payload):
        raise refusal(f"{label} payload must be a non-empty string array")
    dt = data.get("dt")
    if not isinstance(dt, list) or len(dt) != len(payload) - 1 or any(type(d) is not int for d in dt):
        raise refusal(f"{label} dt length must match its payload")
    first, time0 = _count(row["seq0"], f"{label} seq0"), row["time0"]
    if type(time0) is not int:
        raise refusal(f"{label} time0 must be a safe integer")
    turn, step, index = (_count(data.get(key), f"{label} {key}") for key in ("turn", "step", "index"))
    stream: dict[str, Any] = {"type": kind, "time0": time0, "index": index, "dt": dt}
    if tool:
        if type(data.get("id")) is not str or not data["id"] or ("name" in data and type(data["name"]) is not str):
            raise refusal(f"{label} id and optional name must be strings")
        stream["id"] = data["id"]
        if "name" in data:
            stream["name"] = data["name"]
        stream["args"] = payload
    else:
        stream["texts"] = payload
    return ChunkRun(first, len(payload), turn, step, time0 + sum(dt), stream)


class V0ToV1:
    """The edge's per-event normalization, with its state across the log."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.message_ids: dict[int, str] = {}
        self.retry_ids: dict[str, str] = {}
        self.compaction_id: str | None = None

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        sid, seq = self.session_id, event.get("seq")
        # What dsh checks of every event once the chain ran (its JavaScript
        # edges pass an absent or mistyped member along as undefined).
        if type(event.get("type")) is not str:
            raise refusal(f"Session event {seq} type must be a string")
        if not is_safe_int(event.get("time")):
            raise refusal(f"Session event {seq} time must be a safe integer")
        event_type = _RENAMED.get(event["type"], event["type"])
        if event_type != event.get("type"):
            event = {**event, "type": event_type}
        if event_type in ("request/header-delta", "mode/set"):
            raise FormatUnsupportedError(f"session {_js(sid)} contains unsupported legacy {event_type} event at seq "
                                         f"{seq}")
        data = event.get("data")
        if not isinstance(data, dict):
            raise refusal(f"{event_type} {seq} data must be a JSON object")
        if event_type == "request/header" and data.get("reason") == "fallback":
            raise FormatUnsupportedError(f'session {_js(sid)} contains unsupported request/header reason "fallback" '
                                         f"at seq {seq}")
        event = self._message(self._compaction(self._retry(self._steering(self._request_header(
            self._turn_end(self._turn_start(event)))))))
        if event["type"] != "assistant/chunk":
            check_payload(event)
        message = event["data"] if event["type"] == "user/message" else event["data"].get("message")
        if isinstance(message, dict) and type(message.get("id")) is str and seq is not None:
            self.message_ids[seq] = message["id"]
        return event

    def _malformed(self, event_type: str, seq: Any) -> FormatUnsupportedError:
        return refusal(f"session {_js(self.session_id)} contains malformed pre-react-loop {event_type} at seq {seq}")

    def _turn_start(self, event: dict[str, Any]) -> dict[str, Any]:
        """A pre-react-loop ``turn/start`` loses its ``trigger``."""
        data, seq = event["data"], event["seq"]
        if event["type"] != "turn/start" or "trigger" not in data:
            return event
        keys(data, ("turn", "trigger"), (), f"turn/start {seq} data")
        turn = count(data["turn"], f"turn/start {seq} turn")
        trigger = record(data["trigger"], f"turn/start {seq} trigger")
        if turn < 1 or type(trigger.get("kind")) is not str or not trigger["kind"]:
            raise self._malformed("turn/start", seq)
        return {**event, "data": {"turn": turn}}

    def _turn_end(self, event: dict[str, Any]) -> dict[str, Any]:
        """Every ``turn/end`` checked; a pre-react-loop reason upgraded."""
        if event["type"] != "turn/end":
            return event
        data, seq = event["data"], event["seq"]
        keys(data, ("turn", "reason"), (), f"turn/end {seq} data")
        if count(data["turn"], f"turn/end {seq} turn") < 1:
            raise self._malformed("turn/end", seq)
        reason = record(data["reason"], f"turn/end {seq} reason")
        kind = reason.get("kind")
        if type(kind) is not str:
            raise self._malformed("turn/end", seq)
        if kind in _PLAIN_ENDS or (kind == "aborted" and "reason" not in reason) or kind == "disposed":
            keys(reason, ("kind",), (), f"turn/end {seq} reason")
            if kind in _PLAIN_ENDS:
                return event
            current = {"kind": "aborted", "reason": {"kind": "legacy" if kind == "aborted" else "disposed"}}
        elif kind == "error" and "error" not in reason:
            current = self._error_reason(reason, seq)
        else:
            return event
        return {**event, "data": {**data, "reason": current}}

    def _error_reason(self, reason: dict[str, Any], seq: Any) -> dict[str, Any]:
        count(reason.get("step"), f"turn/end {seq} error step")
        if "failure" in reason:
            keys(reason, ("kind", "step", "failure"), (), f"turn/end {seq} reason")
            failure = record(reason["failure"], f"turn/end {seq} failure")
            keys(failure, ("message", "code"), ("status", "providerRetryAfterMs", "requestId"),
                 f"turn/end {seq} failure")
            if type(failure["message"]) is not str or type(failure["code"]) is not str:
                raise self._malformed("turn/end", seq)
            return {"kind": "error", "error": failure}
        keys(reason, ("kind", "step", "message"), ("code",), f"turn/end {seq} reason")
        code = reason.get("code", "UNKNOWN")
        if type(reason["message"]) is not str or type(code) is not str:
            raise self._malformed("turn/end", seq)
        return {"kind": "error", "error": {"message": reason["message"], "code": code}}

    def _steering(self, event: dict[str, Any]) -> dict[str, Any]:
        """A ``steering/message`` becomes the ``user/message`` it carries."""
        if event["type"] != "steering/message":
            return event
        data, seq = event["data"], event["seq"]
        label = f"steering/message {seq}"
        if "message" in data:
            keys(data, ("turn", "message"), (), f"{label} data")
            count(data["turn"], f"{label} turn")
            return {**event, "type": "user/message", "data": data["message"]}
        keys(data, ("turn", "content", "source"), (), f"{label} data")
        count(data["turn"], f"{label} turn")
        message = {key: value for key, value in data.items() if key != "turn"}
        return {**event, "type": "user/message",
                "data": {**message, "id": legacy_message_id(self.session_id, seq), "role": "user"}}

    def _message(self, event: dict[str, Any]) -> dict[str, Any]:
        """A message stored before message ids gets dsh's legacy shape and id."""
        event_type, data, seq = event["type"], event["data"], event["seq"]
        if not isinstance(data, dict):
            raise refusal(f"{event_type} {seq} data must be a JSON object")
        if event_type == "user/message":
            if "id" in data or "role" in data or "message" in data or "content" not in data or "source" not in data:
                return event
            return {**event, "data": {**data, "id": legacy_message_id(self.session_id, seq), "role": "user"}}
        if event_type == "assistant/message":
            if "message" in data or "content" not in data or "provenance" not in data:
                return event
            rest = {key: value for key, value in data.items() if key not in ("content", "provenance")}
            source = record(data["provenance"], f"assistant/message {seq} legacy source")
            rest["message"] = {"id": legacy_message_id(self.session_id, seq), "role": "assistant",
                               "content": data["content"], "source": {**source, "kind": "model"}}
            return {**event, "data": rest}
        if event_type != "tool/result" or "message" in data or any(key not in data for key in
                                                                     ("callId", "content", "isError")):
            return event
        call_id, is_error = data["callId"], data["isError"]
        if type(call_id) is not str or type(is_error) is not bool:
            return event
        operation = event.get("surfaceOp")
        start = operation.get("start") if isinstance(operation, dict) and operation.get("op") == "replace" else None
        message_id = legacy_message_id(self.session_id, seq) if start is None else self._replaced_id(start)
        if message_id is None:
            raise refusal(f"tool/result {seq} replacement cites a message without identity")
        rest = {key: value for key, value in data.items() if key not in ("callId", "content", "isError")}
        rest["message"] = {"id": message_id, "role": "user",
                           "content": [{"type": "tool-result", "toolCallId": call_id, "content": data["content"],
                                        "isError": is_error}],
                           "source": {"kind": "tool", "callId": call_id}}
        return {**event, "data": rest}

    def _replaced_id(self, start: Any) -> str | None:
        return self.message_ids.get(start) if type(start) is int else None

    def _request_header(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] != "request/header":
            return event
        header = record(event["data"].get("header"), f"request/header {event['seq']} header")
        if "messagePrefix" not in header:
            return event
        if not isinstance(header["messagePrefix"], list):
            raise refusal(f"session {_js(self.session_id)} contains malformed request/header messagePrefix at seq "
                          f"{event['seq']}")
        kept = {key: value for key, value in header.items() if key != "messagePrefix"}
        return {**event, "data": {**event["data"], "header": kept}}

    def _retry(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] != "llm/retry":
            return event
        data = event["data"]
        chain = "\0".join(_js(data[key]) if key in data else "" for key in ("turn", "step", "provider", "policyKey"))
        if type(data.get("retryId")) is str and data["retryId"]:
            self.retry_ids[chain] = data["retryId"]
            return event
        if "retryId" in data:
            return event
        retry_id = self.retry_ids.setdefault(chain, f"legacy-retry:{self.session_id}:{event['seq']}")
        return {**event, "data": {**data, "retryId": retry_id}}

    def _compaction(self, event: dict[str, Any]) -> dict[str, Any]:
        event_type, data = event["type"], event["data"]
        if event_type == "session/end-seed":
            self.compaction_id = None
        elif event_type == "compaction/start":
            if type(data.get("compactionId")) is str and data["compactionId"]:
                self.compaction_id = data["compactionId"]
            elif "compactionId" not in data:
                self.compaction_id = f"legacy-compaction:{self.session_id}:{event['seq']}"
                return {**event, "data": {**data, "compactionId": self.compaction_id}}
        elif self.compaction_id is None:
            return event
        elif event_type in ("compaction/summary", "compaction/end"):
            opened = self.compaction_id
            if event_type == "compaction/end":
                self.compaction_id = None
            if "compactionId" not in data:
                return {**event, "data": {**data, "compactionId": opened}}
        elif event_type == "user/message":
            source = data.get("source")
            if isinstance(source, dict) and source.get("kind") == "plugin" and source.get("plugin") == "compact" \
                    and "compactionId" not in source:
                return {**event, "data": {**data, "source": {**source, "compactionId": self.compaction_id}}}
        return event
