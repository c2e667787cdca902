"""Shape rules a seeded or loaded event must meet (docs/formats/v0.md §1, v0 §6.1, v0 §8.6 step 5).

Each check names the event type and seq of the offending event; none walks
more of the payload than its rule reads (block internals are not checked).
"""

from __future__ import annotations

from typing import Any, Callable, TypeGuard

from .errors import EnvelopeError, MessageShapeError, RequestHeaderError
from .events import RETIRED_TYPES
from .jsonvalue import is_safe_int

__all__ = [
    "Where",
    "ENVELOPE_KEYS",
    "check_envelope",
    "check_retired",
    "check_message_shape",
    "check_request_header",
    "message_of",
]

#: Where an event sits, for messages: text, or a function that builds it (so
#: hot paths only pay for the text when something is wrong).
Where = str | Callable[[], str]


def _at(where: Where) -> str:
    return where if isinstance(where, str) else where()


ENVELOPE_KEYS = frozenset({"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"})


def check_envelope(event: Any, index: int) -> None:
    """Envelope of docs/formats/v0.md §1: only the known keys, string ``type``, safe-int
    ``seq ≥ 0`` and ``time``, a ``data`` key, ``ignorable`` only ``true``."""
    if not isinstance(event, dict):
        raise EnvelopeError(f"event at index {index} is not a JSON object")
    if not ENVELOPE_KEYS.issuperset(event.keys()):
        key = next(key for key in event if key not in ENVELOPE_KEYS)
        raise EnvelopeError(f"event at index {index} has an invalid envelope: unexpected key {key!r}")
    seq = event.get("seq")
    time = event.get("time")
    if type(event.get("type")) is not str:
        raise EnvelopeError(f"event at index {index} has an invalid envelope: type must be a string")
    if not is_safe_int(seq) or seq < 0:
        raise EnvelopeError(f"event at index {index} has an invalid envelope: seq {seq!r} is not a non-negative safe integer")
    if not is_safe_int(time):
        raise EnvelopeError(f"event at index {index} (seq {seq}) has an invalid envelope: time {time!r} is not a safe integer")
    if "data" not in event:
        raise EnvelopeError(f"event at index {index} (seq {seq}) has an invalid envelope: data is missing")
    if "ignorable" in event and event["ignorable"] is not True:
        raise EnvelopeError(f"event at index {index} (seq {seq}) has an invalid envelope: ignorable must be true when present")


def check_retired(event_type: Any, data: Any, where: Where) -> None:
    """Reject the retired vocabulary of docs/formats/v0.md §8.10 (``request/header-delta``,
    ``mode/set``, header reason ``fallback``)."""
    if event_type in RETIRED_TYPES:
        raise RequestHeaderError(f"{_at(where)} uses the retired event type {event_type!r}")
    if event_type == "request/header" and isinstance(data, dict) and data.get("reason") == "fallback":
        raise RequestHeaderError(f'{_at(where)} uses the retired request/header reason "fallback"')


def message_of(event_type: str, data: Any) -> Any:
    """The message object an event of a surface type carries (or ``None``)."""
    if event_type == "user/message":
        return data
    if isinstance(data, dict):
        return data.get("message")
    return None


def _nonempty_str(value: Any) -> TypeGuard[str]:
    return type(value) is str and value != ""


def check_message_shape(event_type: str, data: Any, where: Where) -> None:
    """Message shape of docs/formats/v0.md §8.6 step 5 for the three surface types."""
    message = message_of(event_type, data)
    if not isinstance(message, dict) or not _nonempty_str(message.get("id")):
        raise MessageShapeError(f"{_at(where)} lacks an identified message (a non-empty string id)")
    expected_role = "assistant" if event_type == "assistant/message" else "user"
    if message.get("role") != expected_role:
        raise MessageShapeError(f'{_at(where)}: message role must be "{expected_role}", got {message.get("role")!r}')
    source = message.get("source")
    if not isinstance(source, dict) or not _nonempty_str(source.get("kind")):
        raise MessageShapeError(f"{_at(where)}: message source must be an object with a non-empty string kind")
    content = message.get("content")
    if not isinstance(content, (list, tuple)):
        raise MessageShapeError(f"{_at(where)}: message content must be an array")
    if event_type == "assistant/message":
        if source.get("kind") != "model" or not _nonempty_str(source.get("provider")) or not _nonempty_str(source.get("model")):
            raise MessageShapeError(f'{_at(where)}: assistant message source must be kind "model" with provider and model')
        return
    if event_type != "tool/result":
        return
    if source.get("kind") != "tool" or not _nonempty_str(source.get("callId")):
        raise MessageShapeError(f'{_at(where)}: tool result source must be kind "tool" with a non-empty callId')
    block = content[0] if len(content) == 1 else None
    if not isinstance(block, dict) or block.get("type") != "tool-result" or not isinstance(block.get("content"), (list, tuple)):
        raise MessageShapeError(f"{_at(where)}: tool result message must hold exactly one tool-result block with array content")
    if block.get("toolCallId") != source.get("callId"):
        raise MessageShapeError(
            f"{_at(where)}: tool-result toolCallId {block.get('toolCallId')!r} does not match source callId {source.get('callId')!r}")


def check_request_header(data: Any, where: Where) -> None:
    """Load-time checks of a ``request/header`` payload (docs/formats/v0.md §6.1)."""
    given = data.get("header") if isinstance(data, dict) else None
    header: dict[str, Any] = given if isinstance(given, dict) else {}
    config = header.get("config")
    if not isinstance(config, dict) or not _nonempty_str(config.get("provider")) or not _nonempty_str(config.get("model")):
        raise RequestHeaderError(f"{_at(where)}: request header config lacks provider/model")
    effort = config.get("reasoningEffort", _ABSENT)
    if effort is not _ABSENT and not _nonempty_str(effort):
        raise RequestHeaderError(f"{_at(where)}: request header reasoningEffort must be a non-empty string")
    defaults = header.get("adapterDefaults", _ABSENT)
    if defaults is _ABSENT:
        return
    if not isinstance(defaults, dict):
        raise RequestHeaderError(f"{_at(where)}: adapterDefaults must be an object")
    for key, marker in defaults.items():
        if key not in ("reasoningEffort", "maxTokens"):
            raise RequestHeaderError(f"{_at(where)}: adapterDefaults has unexpected key {key!r}")
        if marker is not True:
            raise RequestHeaderError(f"{_at(where)}: adapterDefaults.{key} must be true")
        if key not in config:
            raise RequestHeaderError(f"{_at(where)}: adapterDefaults.{key} is set but config.{key} is absent")


_ABSENT: Any = object()
