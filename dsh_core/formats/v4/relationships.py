"""Per-event relationships of a v4 log (the first pass of dsh 0.2.1's
``assertReleasedV4Relationships``): developer data, producer-owned message
sources and delivery markers. The lifecycle pass is :mod:`.lifecycle`.
Every refusal is :class:`RelationshipError` (corrupt-storage) with dsh's text.
"""

from __future__ import annotations

from typing import Any

from ...errors import CorruptionError
from ...jsonvalue import MAX_SAFE_INTEGER
from ...session_header import SessionHeader
from .admission import AdmissionError, check_developer_data, check_source
from .vocabulary import KNOWN_TYPES

__all__ = ["RelationshipError", "check_event"]  # and the small checks .lifecycle and .lookback share


class _Marker:
    """A named stand-in value (a fold snapshot saves what it means, never the marker)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: A field the event does not have.
ABSENT: Any = _Marker("ABSENT")
#: A user message without a source object.
NO_SOURCE: Any = _Marker("NO_SOURCE")


class RelationshipError(CorruptionError):
    """A v4 log whose events do not relate as dsh requires."""

def _count(value: Any, label: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise RelationshipError(f"{label} must be a non-negative safe integer")
    return value

def _record(value: Any, subject: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RelationshipError(f"{subject} requires an object")
    return value


def _text(value: Any, subject: str) -> str:
    if type(value) is not str or not value:
        raise RelationshipError(f"{subject} requires a nonempty string")
    return value


def _array(value: Any, subject: str) -> list[Any]:
    if not isinstance(value, list):
        raise RelationshipError(f"{subject} requires an array")
    return value


def _earlier(value: Any, seq: int, subject: str) -> int:
    coordinate = _count(value, subject)
    if coordinate >= seq:
        raise RelationshipError(f"{subject} must name an earlier event")
    return coordinate


def _messages(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of an event's payload (dsh's ``mapEventMessages``)."""
    event_type, data = event["type"], event["data"]
    if not isinstance(data, dict):
        return []
    if event_type == "user/message":
        return [data]
    if event_type in ("developer/message", "system/message", "assistant/message", "tool/result"):
        if not isinstance(data.get("message"), dict):
            raise RelationshipError(f"{event_type} requires a message")
        return [data["message"]]
    if event_type not in ("agent/inbox/spliced", "session/title-llm-request"):
        return []
    messages = data.get("inserted" if event_type == "agent/inbox/spliced" else "messages")
    if not isinstance(messages, list):
        raise RelationshipError(f"{event_type} requires message array")
    if not all(isinstance(message, dict) for message in messages):
        raise RelationshipError(f"{event_type} requires message objects")
    return messages


def _delivery_session(event: dict[str, Any]) -> str | None:
    """dsh's ``validateDeliveryAccepted`` for the current generation (v4)."""
    if event["type"] != "session-log-deepseek/delivery-accepted":
        return None
    data = event["data"]
    if not isinstance(data, dict):
        raise RelationshipError("delivery-accepted data must be an object")
    if _count(data.get("sessionFormatVersion", 0), "delivery sessionFormatVersion") != 4:
        return None
    if _count(data.get("throughSeq"), "delivery throughSeq") >= event["seq"]:
        raise RelationshipError("delivery throughSeq must precede its marker")
    session_id = data.get("sessionId")
    if type(session_id) is not str or not session_id:
        raise RelationshipError("delivery requires a nonempty Session id")
    return session_id


def check_event(header: SessionHeader, event: dict[str, Any]) -> bool:
    """The per-event checks dsh makes of a whole log before its lifecycle.
    Returns whether the event is a current-generation delivery marker
    naming another session: refused unless it lies in a fork's inherited
    prefix, which only the rest of the log can tell."""
    if event["type"] not in KNOWN_TYPES:
        return False
    try:
        check_developer_data(event)
        for message in _messages(event):
            check_source(message)
    except AdmissionError as exc:
        raise RelationshipError(exc.message) from None
    delivered = _delivery_session(event)
    return delivered is not None and delivered != header.id

