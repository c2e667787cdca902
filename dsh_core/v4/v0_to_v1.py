"""dsh's v0 codec and v0→v1 edge: a stored v0 row as dsh 0.2.1 migrates it.

Rows decode as dsh's released v0 codec decodes them: a packed chunk row
stays whole (:class:`~.v1_to_v2.ChunkRun`), an event's range-encoded
``sourceEventSeqs`` expand. The edge then normalizes each event in dsh's
order — ``compact/*`` renamed, retired ``request/header-delta``/``mode/set``
and the ``fallback`` header reason refused, legacy ``turn/start``,
``turn/end``, ``messagePrefix``, steering and message shapes upgraded
(:mod:`dsh_core.storage.legacy`, with dsh 0.2.1's rule that a replacing
legacy tool result takes the id of the message it replaces), retries and
compactions without ids given dsh's legacy ids — and checks its payload
members against dsh's frozen v0 inventory (the key sets; the nested
per-type checks of dsh's inventory are not repeated here: what they refuse
is refused by the v4 reading of the result or, where it is not, named in
the differential test's gaps).
"""

from __future__ import annotations

from typing import Any

from ..errors import DshError, FormatUnsupportedError
from ..jsonvalue import encode_json
from ..storage.legacy import upgrade_event
from .rows import decode_seq_ranges
from .v1_to_v2 import ChunkRun

__all__ = ["V0ToV1", "decode_v0_row", "refusal"]

EDGE = "@deepseek-ai/dsh-session-format-v0-to-v1"
_PACKED = frozenset({"text-chunks", "reasoning-chunks", "tool-call-chunks"})
_RENAMED = {"compact/start": "compaction/start", "compact/summary": "compaction/summary",
            "compact/end": "compaction/end", "compact/prune": "compaction/prune"}

#: dsh's frozen v0 inventory: each type's required and optional ``data`` members.
INVENTORY: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "agent-preset/selected": (("agentPreset",), ()),
    "agent/inbox/spliced": (("target", "start", "inserted"), ("removedCount", "outcome")),
    "approval/asked": (("id", "toolName"), ("callId", "reason")),
    "approval/decided": (("id", "outcome"), ()),
    "approval/policy": (("policy",), ("source",)),
    "assistant/chunk": (("turn", "step", "chunk"), ()),
    "assistant/message": (("turn", "step", "message"), ("usage", "interrupted")),
    "command/done": (("commandId", "kind"), ("text", "sourceEventSeq")),
    "command/run": (("commandId", "name", "source"), ("args",)),
    "compaction/end": (("compactionId", "turn"), ("sourceCommandId", "error")),
    "compaction/prune": (("shadowedRange", "shadowedSeqs", "shadowedTokenCount"), ()),
    "compaction/start": (("compactionId", "turn"), ("sourceCommandId",)),
    "compaction/summary": (("compactionId", "summary", "shadowedRange", "shadowedSeqs", "shadowedTokenCount",
                            "provider", "model"), ("sourceCommandId", "maxTokens", "usage", "rawOutput",
                                                   "llmStreamCall")),
    "feedback/record": (("text",), ()),
    "goal/change": (("kind", "version", "operation"), ("goal", "roundsStarted", "createdAt", "updatedAt", "cleared",
                                                       "clearedAt")),
    "hook/invoked": (("turn", "point", "dialect", "handlerId"), ("matcher",)),
    "hook/result": (("turn", "point", "handlerId", "decision", "durationMs"), ("exitCode", "stderrSummary")),
    "llm/retry": (("retryId", "turn", "step", "provider", "mode", "policyKey", "retry", "delayMs", "failure"),
                  ("maxRetries",)),
    "llm/retry-started": (("retryId", "turn", "step", "retry"), ()),
    "model/selection": (("provider", "model"), ("reasoningEffort",)),
    "permission/preset": (("preset",), ()),
    "plan/mode": (("active",), ()),
    "request/context": (("provider", "model"), ("contextWindow",)),
    "request/header": (("header", "reason"), ("startsSeries",)),
    "sandbox/mode": (("mode",), ("source",)),
    "schedule/change": (("version", "operation"), ("schedule", "id", "acceptedAt")),
    "session-log-deepseek/delivery-accepted": (("sessionId", "throughSeq"), ()),
    "session/end-seed": ((), ()),
    "session/title": (("title", "messageSeqs", "source"), ()),
    "session/title-llm-request": (("titleProvider", "messageSeqs", "route", "system", "messages", "maxTokens"), ()),
    "step/end": (("turn", "step"), ()),
    "step/start": (("turn", "step"), ()),
    "subagent/descriptor": (("mode", "version", "provider"), ("label", "agentProvider", "agentModel",
                                                              "agentReasoningEffort", "persona", "toolFilter")),
    "subagent/model-selection-policy": (("allowedModels",), ()),
    "team/member": (("version", "teamId", "member"), ()),
    "team/message/delivered": (("version", "teamId", "messageId", "targetId"), ()),
    "team/message/queued": (("version", "teamId", "message"), ()),
    "team/task": (("version", "teamId", "task"), ()),
    "todo/write": (("todos",), ()),
    "tool-workflow/agent-end": (("runId", "seq", "outcome"), ()),
    "tool-workflow/agent-start": (("runId", "seq", "label", "childId"), ("phase",)),
    "tool-workflow/run-end": (("runId", "stopReason"), ()),
    "tool-workflow/run-start": (("runId", "name"), ()),
    "tool/call": (("turn", "step", "callId", "name", "arguments"), ()),
    "tool/code-dispatch": (("rootCallId", "parentCallId", "subCallId", "name", "arguments", "isError", "content"), ()),
    "tool/code-dispatch-start": (("rootCallId", "parentCallId", "subCallId", "name", "arguments"), ()),
    "tool/result": (("turn", "step", "message"), ("error", "meta")),
    "turn/end": (("turn", "reason"), ()),
    "turn/start": (("turn",), ()),
    "user/message": (("role", "id", "content", "source"), ()),
    "web/deepseek-search-llm-request": (("endpoint", "apiVersion", "body"), ()),
}


def refusal(message: str, edge: str = EDGE, version: int = 0) -> FormatUnsupportedError:
    """A refusal of an edge, worded as dsh wraps its format errors."""
    return FormatUnsupportedError(f"{edge} refuses this format v{version} Session: {message}")


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
    if value.get("type") in _PACKED:
        return _decode_run(value, value["type"], row)
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
        event_type = _RENAMED.get(event.get("type"), event.get("type"))
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
        try:
            event = upgrade_event(event, sid, self._replaced_id)
        except DshError as error:
            raise refusal(error.message) from None
        event = self._compaction(self._retry(self._request_header(event)))
        if event["type"] != "assistant/chunk":
            self._inventory(event)
        message = event["data"] if event["type"] == "user/message" else event["data"].get("message")
        if isinstance(message, dict) and type(message.get("id")) is str:
            self.message_ids[seq] = message["id"]
        return event

    def _replaced_id(self, start: Any) -> str | None:
        return self.message_ids.get(start) if type(start) is int else None

    def _request_header(self, event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] != "request/header":
            return event
        header = event["data"].get("header")
        if not isinstance(header, dict) or "messagePrefix" not in header:
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

    def _inventory(self, event: dict[str, Any]) -> None:
        """dsh's ``assertReleasedEventPayload`` key checks."""
        event_type, seq, data = event["type"], event["seq"], event["data"]
        members = INVENTORY.get(event_type)
        if members is None:
            raise FormatUnsupportedError(f"format v0 contains unknown historical event type {_js(event_type)} at seq "
                                         f"{seq}; migration refuses unknown historical events even when ignorable")
        label = f"{event_type} {seq}"
        if event_type == "subagent/descriptor" and data.get("version") != 3:
            raise FormatUnsupportedError(f"{label} uses unsupported descriptor version "
                                         f"{_count(data.get('version'), f'{label} version')}")
        required, optional = members
        unexpected = next((key for key in data if key not in required and key not in optional), None)
        if unexpected is not None:
            raise refusal(f"{label} data has unexpected member {_js(unexpected)}")
        missing = next((key for key in required if key not in data), None)
        if missing is not None:
            raise refusal(f"{label} data lacks required member {_js(missing)}")
