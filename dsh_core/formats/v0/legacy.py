"""Legacy v0 shapes (docs/formats/v0.md §8.10), upgraded while a stored log is loaded.

Each upgrade is a named function over one decoded event object; together
:func:`upgrade_event` applies them in the reference's order (turn/start,
turn/end, steering/message, message wrappers). Current-looking malformed
events are left alone so validation rejects them; malformed legacy shapes
raise :class:`LegacyShapeError`. ``turn/end`` shapes are validated here.
"""

from __future__ import annotations

from typing import Any, Callable

from ...errors import LegacyShapeError
from ...jsonvalue import is_safe_int

__all__ = ["legacy_message_id", "upgrade_event"]

MessageIdAt = Callable[[Any], "str | None"]

_PLAIN_REASONS = frozenset({"completed", "blocked", "max-tokens", "interrupted"})


def legacy_message_id(session_id: str, seq: Any) -> str:
    """The stable id minted for a message stored before ids existed."""
    return f"legacy-message:{session_id}:{_js_str(seq)}"


def _js_str(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _record(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _only_keys(record: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> bool:
    allowed = set(required) | set(optional)
    return all(key in allowed for key in record) and all(key in record for key in required)


def _malformed(session_id: str, what: str, seq: Any) -> LegacyShapeError:
    return LegacyShapeError(f"session {session_id!r} contains malformed pre-current {what} at seq {seq}")


def upgrade_turn_start(event: dict[str, Any], session_id: str) -> dict[str, Any]:
    """``turn/start`` with ``trigger`` → drop the trigger."""
    data = _record(event.get("data"))
    if data is None or "trigger" not in data:
        return event
    trigger = _record(data["trigger"])
    turn = data.get("turn")
    if (not is_safe_int(turn) or turn < 1 or not _only_keys(data, ("turn", "trigger")) or trigger is None
            or type(trigger.get("kind")) is not str or not trigger["kind"]):
        raise _malformed(session_id, "turn/start", event.get("seq"))
    return {**event, "data": {"turn": turn}}


def _error_failure(reason: dict[str, Any]) -> dict[str, Any] | None:
    failure = _record(reason.get("failure"))
    if failure is None or not _only_keys(reason, ("kind", "step", "failure")):
        return None
    if not _only_keys(failure, ("message", "code"), ("status", "providerRetryAfterMs", "requestId")):
        return None
    if type(failure.get("message")) is not str or type(failure.get("code")) is not str:
        return None
    for key, kind in (("status", (int, float)), ("providerRetryAfterMs", (int, float)), ("requestId", (str,))):
        if key in failure and (type(failure[key]) not in kind):
            return None
    return failure


def upgrade_turn_end(event: dict[str, Any], session_id: str) -> dict[str, Any]:
    """Validate every ``turn/end`` and map old reasons to current ones."""
    data = _record(event.get("data"))
    if data is None:
        return event
    seq = event.get("seq")
    reason = _record(data.get("reason"))
    turn = data.get("turn")
    if (not is_safe_int(turn) or turn < 1 or not _only_keys(data, ("turn", "reason"))
            or reason is None or type(reason.get("kind")) is not str):
        raise _malformed(session_id, "turn/end", seq)
    kind = reason["kind"]
    if kind in _PLAIN_REASONS:
        if not _only_keys(reason, ("kind",)):
            raise _malformed(session_id, "turn/end", seq)
        return event
    if kind == "aborted":
        if "reason" in reason:
            return event
        if not _only_keys(reason, ("kind",)):
            raise _malformed(session_id, "turn/end", seq)
        current = {"kind": "aborted", "reason": {"kind": "legacy"}}
    elif kind == "disposed":
        if not _only_keys(reason, ("kind",)):
            raise _malformed(session_id, "turn/end", seq)
        current = {"kind": "aborted", "reason": {"kind": "disposed"}}
    elif kind == "error":
        if "error" in reason:
            return event
        step = reason.get("step")
        if not is_safe_int(step) or step < 0:
            raise _malformed(session_id, "turn/end", seq)
        failure = _error_failure(reason)
        if failure is not None:
            current = {"kind": "error", "error": failure}
        else:
            code = reason.get("code")
            required = ("kind", "step", "message") if "code" not in reason else ("kind", "step", "message", "code")
            if (not _only_keys(reason, required) or type(reason.get("message")) is not str
                    or ("code" in reason and type(code) is not str)):
                raise _malformed(session_id, "turn/end", seq)
            current = {"kind": "error", "error": {"message": reason["message"],
                                                  "code": code if type(code) is str else "UNKNOWN"}}
    else:
        return event
    return {**event, "data": {**data, "reason": current}}


def upgrade_steering(event: dict[str, Any], session_id: str) -> dict[str, Any]:
    """``steering/message`` → a ``user/message`` (surface append)."""
    data = _record(event.get("data"))
    seq = event.get("seq")
    if data is None:
        raise _malformed(session_id, "steering/message", seq)
    wrapped = _record(data.get("message"))
    if wrapped is not None and is_safe_int(data.get("turn")) and _only_keys(data, ("turn", "message")):
        return {**event, "type": "user/message", "data": wrapped}
    if not is_safe_int(data.get("turn")) or not _only_keys(data, ("turn", "content", "source")):
        raise _malformed(session_id, "steering/message", seq)
    message = {k: v for k, v in data.items() if k != "turn"}
    message["id"] = legacy_message_id(session_id, seq)
    message["role"] = "user"
    return {**event, "type": "user/message", "data": message}


def _replacement_start(event: dict[str, Any]) -> Any:
    op = _record(event.get("surfaceOp"))
    if op is not None and op.get("op") == "replace" and type(op.get("start")) in (int, float):
        return op["start"]
    return None


def upgrade_message(event: dict[str, Any], session_id: str, message_id_at: MessageIdAt) -> dict[str, Any]:
    """Wrap a pre-identity message payload into the current message shape.

    ``message_id_at(seq)`` gives the message id of an earlier surface event,
    so a replacing legacy ``tool/result`` inherits the replaced message's id.
    """
    data = _record(event.get("data"))
    if data is None:
        return event
    event_type = event.get("type")
    seq = event.get("seq")
    if event_type == "user/message":
        if "id" in data or "role" in data or "message" in data or "content" not in data or "source" not in data:
            return event
        return {**event, "data": {**data, "id": legacy_message_id(session_id, seq), "role": "user"}}
    if event_type == "assistant/message":
        if "message" in data or "content" not in data or "provenance" not in data:
            return event
        rest = {k: v for k, v in data.items() if k not in ("content", "provenance")}
        provenance = _record(data["provenance"]) or {}
        rest["message"] = {"id": legacy_message_id(session_id, seq), "role": "assistant",
                           "content": data["content"], "source": {**provenance, "kind": "model"}}
        return {**event, "data": rest}
    if event_type == "tool/result":
        if "message" in data or "callId" not in data or "content" not in data or "isError" not in data:
            return event
        call_id = data["callId"]
        rest = {k: v for k, v in data.items() if k not in ("callId", "content", "isError")}
        start = _replacement_start(event)
        message_id = legacy_message_id(session_id, seq) if start is None else message_id_at(start)
        message: dict[str, Any] = {"role": "user",
                                   "content": [{"type": "tool-result", "toolCallId": call_id,
                                                "content": data["content"], "isError": data["isError"]}],
                                   "source": {"kind": "tool", "callId": call_id}}
        if message_id is not None:
            message = {"id": message_id, **message}
        rest["message"] = message
        return {**event, "data": rest}
    return event


def upgrade_event(event: Any, session_id: str, message_id_at: MessageIdAt) -> Any:
    """All legacy upgrades of one stored event, in the reference's order."""
    if not isinstance(event, dict):
        return event
    event_type = event.get("type")
    if event_type == "turn/start":
        event = upgrade_turn_start(event, session_id)
    elif event_type == "turn/end":
        event = upgrade_turn_end(event, session_id)
    elif event_type == "steering/message":
        event = upgrade_steering(event, session_id)
    if event.get("type") in ("user/message", "assistant/message", "tool/result"):
        event = upgrade_message(event, session_id, message_id_at)
    return event
