"""What dsh 0.2.1 admits of a released v3 log before migrating it: each
row's structure (``assertV3RowAdmission``, checked even in a crashed tail)
and each decoded event's v3 envelope (``assertV3Event``)."""

from __future__ import annotations

from typing import Any

from ...errors import CorruptionError, FormatUnsupportedError
from ...jsonvalue import MAX_SAFE_INTEGER
from ..v4.fold import _show
from ..v4.vocabulary import KNOWN_TYPES

__all__ = ["V3_TYPES", "admit_row", "check_envelope"]

#: What the released v3 reader knew: v4's vocabulary without what v4 added.
V3_TYPES = KNOWN_TYPES - {"developer/message", "job/registered", "job/settled", "working-directory/change"}
_V3_SURFACE_TYPES = frozenset({"system/message", "user/message", "assistant/message", "tool/result"})


def _count(value: Any, label: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise CorruptionError(f"{label} must be a non-negative safe integer")
    return value


def _keys(value: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...], label: str) -> None:
    missing = next((key for key in required if key not in value), None)
    if missing is not None:
        raise CorruptionError(f"{label} lacks required field {missing}")
    extra = next((key for key in value if key not in required and key not in optional), None)
    if extra is not None:
        raise CorruptionError(f"{label} has unexpected field {extra}")


def _record(value: Any, label: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CorruptionError(f"{label} must be an object")
    return value


def admit_row(row: Any) -> None:
    """dsh's ``assertV3RowAdmission``: refused even in a crashed tail."""
    if not isinstance(row, dict):
        return
    if row.get("type") == "request/header":
        data = _record(row.get("data"), "request/header data")
        if "system" in _record(data.get("header"), "request header"):
            raise FormatUnsupportedError("format v3 request/header rejects retired header.system")
    elif row.get("type") == "system/message":
        data = _record(row.get("data"), "system/message data")
        _keys(data, ("turn", "step", "message"), (), "system/message data")
        for coordinate in ("turn", "step"):
            if _count(data[coordinate], coordinate) == 0:
                raise CorruptionError(f"{coordinate} must be positive")
        message = _record(data["message"], "system message")
        _keys(message, ("id", "role", "source", "content"), (), "system message")
        if type(message["id"]) is not str or not message["id"] or message["role"] != "system":
            raise CorruptionError("system message requires an id and system role")
        source = _record(message["source"], "system source")
        if source.get("kind") != "plugin" or type(source.get("plugin")) is not str or not source["plugin"]:
            raise CorruptionError("system message requires plugin source")
    if row.get("type") in ("tool/code-dispatch-start", "tool/code-dispatch") and row.get("ignorable") is not True:
        raise FormatUnsupportedError(f"format v3 contains unknown event type {_show(row['type'])} at seq {_show(row.get('seq'))}")


def check_envelope(event: dict[str, Any]) -> None:
    """dsh's ``assertV3Event``: the v3 envelope of a decoded event."""
    event_type, seq = event["type"], event["seq"]
    subject = f"format v3 {event_type} at seq {seq}"
    opaque = event_type not in V3_TYPES or event_type in ("tool/code-dispatch-start", "tool/code-dispatch")
    surface = event_type in _V3_SURFACE_TYPES
    _keys(event, ("type", "seq", "time", "data"),
          ("ignorable", "surfaceOp", "sourceEventSeqs") if surface or opaque else ("ignorable",), subject)
    if surface:
        operation = event.get("surfaceOp")
        if operation is None:
            raise CorruptionError(f"{subject} requires a surfaceOp marker")
        if operation != "append":
            replace = _record(operation, f"{subject} surfaceOp")
            if len(replace) != 3 or replace.get("op") != "replace" or "startSeq" not in replace or "endSeq" not in replace:
                raise CorruptionError(f"{subject} requires exact replace fields op/startSeq/endSeq")
            for key in ("startSeq", "endSeq"):
                if _count(replace[key], f"{subject} surfaceOp {key}") >= seq:
                    raise CorruptionError(f"{subject} replacement endpoints must reference earlier events")
        if event_type == "assistant/message" and "sourceEventSeqs" in event:
            raise CorruptionError(f"{subject} embeds its stream and cannot carry sourceEventSeqs")
        if "sourceEventSeqs" in event and not event["sourceEventSeqs"]:
            raise CorruptionError(f"{subject} sourceEventSeqs must be a non-empty array")
    if event_type == "request/header":
        header = _record(_record(event["data"], f"{subject} data").get("header"), f"{subject} header")
        if (isinstance(header.get("tools"), list) and not header["tools"]) or (
                isinstance(header.get("adapterDefaults"), dict) and not header["adapterDefaults"]):
            raise CorruptionError(f"{subject} empty optional header fields must be omitted")
    if event_type == "tool/result":
        data = _record(event["data"], f"{subject} data")
        if "error" in data:
            content = _record(data.get("message"), f"{subject} message").get("content")
            if (not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict)
                    or content[0].get("type") != "tool-result" or content[0].get("isError") is not True):
                raise CorruptionError(f"{subject} carries error metadata for a non-error tool result")
