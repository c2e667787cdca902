"""Row admission of v4 logs: shapes dsh 0.2.1 refuses on sight.

These checks run on every parsed row before the torn-tail rules, so a row
that breaks one is refused even at the end of a crashed log: retired syntax
(``header.system``, the v0 ``tool-result`` block, PTC code dispatch),
system-message fields, developer messages and tool changes, tool-role
results, fork repair results and producer-owned message sources. Each
raises :class:`AdmissionError` (corrupt-storage) with dsh's text, or
:class:`~dsh_core.errors.FormatUnsupportedError` for a retired event type.
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

from ...errors import CorruptionError, FormatUnsupportedError
from ...jsonvalue import MAX_SAFE_INTEGER

__all__ = ["AdmissionError", "admit_row", "message_slots"]


class AdmissionError(CorruptionError):
    """A row that breaks a v4 admission rule (dsh's text)."""


def _count(value: Any, label: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise AdmissionError(f"{label} must be a non-negative safe integer")
    return value


def _obj(value: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(value, dict)


def message_slots(event_type: Any, data: dict[str, Any]) -> Any:
    """The messages an event's payload carries, or ``None`` (not a list for
    the array slots when the payload is malformed)."""
    if event_type == "user/message":
        return [data]
    if event_type in ("system/message", "developer/message", "assistant/message", "tool/result"):
        return [data.get("message")]
    if event_type == "agent/inbox/spliced":
        return data.get("inserted")
    if event_type == "session/title-llm-request":
        return data.get("messages")
    return None


def check_source(message: dict[str, Any]) -> None:
    source = message.get("source")
    if not _obj(source) or type(source.get("kind")) is not str or not source["kind"] or source["kind"] == "plugin":
        raise AdmissionError("format v4 message requires a producer-owned source kind")


# ------------------------------------------------------------------ developer

def _tool_change(block: Any, developer: bool) -> None:
    if not _obj(block) or block.get("type") not in ("tool-addition", "tool-removal"):
        return
    if not developer:
        raise AdmissionError(f"format v4 {block['type']} requires developer role")
    if type(block.get("toolName")) is not str or not block["toolName"]:
        raise AdmissionError(f"format v4 {block['type']} requires a nonempty toolName")
    if block["type"] == "tool-addition" and "tool" in block:
        raise AdmissionError("format v4 tool-addition must omit inline tool definitions")


def _tool_changes(content: Any, developer: bool = False) -> None:
    if isinstance(content, list):
        for block in content:
            _tool_change(block, developer)


def _ordinary(message: Any) -> None:
    if not _obj(message):
        return
    if message.get("role") == "developer":
        raise AdmissionError("format v4 developer/message and developer role must occur together")
    _tool_changes(message.get("content"))


def _stream_chunks(data: dict[str, Any]) -> list[dict[str, Any]]:
    stream = data.get("stream")
    if not isinstance(stream, list):
        return []
    return [entry["chunk"] for entry in stream
            if _obj(entry) and entry.get("type") == "chunk" and _obj(entry.get("chunk"))]


def check_developer_data(row: dict[str, Any]) -> None:
    """dsh's ``assertV4DeveloperData``."""
    event_type, data = row.get("type"), row.get("data")
    if not _obj(data):
        if event_type == "developer/message":
            raise AdmissionError("format v4 developer/message data must be an object")
        return
    if event_type == "developer/message":
        message = data.get("message")
        if not _obj(message) or message.get("role") != "developer":
            raise AdmissionError("format v4 developer/message requires turn, step, and a developer message")
        for field in ("turn", "step"):
            if _count(data.get(field), f"developer/message {field}") == 0:
                raise AdmissionError(f"developer/message {field} must be positive")
        _tool_changes(message.get("content"), developer=True)
        source = message.get("source")
        if (type(message.get("id")) is not str or not message["id"] or not isinstance(message.get("content"), list)
                or not _obj(source) or type(source.get("kind")) is not str or not source["kind"]
                or source["kind"] == "plugin"):
            raise AdmissionError("format v4 developer message requires id, role, content, and a producer-owned source")
        if any(_obj(block) and block.get("type") == "tool-addition" for block in message["content"]):
            _count(data.get("headerSeq"), "developer/message headerSeq")
        elif "headerSeq" in data:
            raise AdmissionError("format v4 developer/message must omit headerSeq without tool additions")
    elif event_type == "user/message":
        _ordinary(data)
    elif event_type in ("system/message", "assistant/message", "tool/result"):
        _ordinary(data.get("message"))
    elif event_type in ("agent/inbox/spliced", "session/title-llm-request"):
        messages = message_slots(event_type, data)
        if isinstance(messages, list):
            for message in messages:
                _ordinary(message)
    if event_type == "compaction/summary":
        _tool_changes(data.get("summary"))
        _tool_changes(data.get("rawOutput"))
    if event_type in ("assistant/message", "assistant/attempt"):
        for chunk in _stream_chunks(data):
            if chunk.get("type") == "block-end":
                _tool_change(chunk.get("block"), False)
            if chunk.get("type") == "block-start" and chunk.get("blockType") in ("tool-addition", "tool-removal"):
                raise AdmissionError("format v4 tool-change blocks require developer role")
    if event_type == "request/header" and _obj(data.get("header")):
        tools = data["header"].get("tools")
        if isinstance(tools, list):
            for tool in tools:
                if _obj(tool) and "deferLoading" in tool and tool["deferLoading"] is not True:
                    raise AdmissionError("format v4 tool deferLoading must be true when present")


# -------------------------------------------------------------- retired syntax

def _no_wrapper(content: Any, subject: str) -> None:
    if isinstance(content, list):
        for block in content:
            if _obj(block) and block.get("type") == "tool-result":
                raise AdmissionError(f"{subject} must not contain a released tool-result wrapper")


def check_retired_syntax(row: dict[str, Any]) -> None:
    """dsh's ``assertV4RetiredSyntax``."""
    event_type, data = row.get("type"), row.get("data")
    if event_type in ("tool/code-dispatch-start", "tool/code-dispatch") and row.get("ignorable") is not True:
        raise FormatUnsupportedError(f"format v4 rejects retired event type {event_type}")
    if event_type == "request/header":
        if not _obj(data) or not _obj(data.get("header")):
            raise AdmissionError("format v4 request/header requires data and header objects")
        if "system" in data["header"]:
            raise AdmissionError("format v4 request/header rejects retired header.system")
        return
    if not _obj(data):
        return
    subject = f"format v4 {_js_string(event_type)} at seq {_js_string(row.get('seq'))} content"
    if event_type == "user/message":
        _no_wrapper(data.get("content"), subject)
    elif event_type in ("developer/message", "assistant/message", "team/message/queued"):
        if _obj(data.get("message")):
            _no_wrapper(data["message"].get("content"), subject)
    elif event_type in ("agent/inbox/spliced", "session/title-llm-request"):
        messages = message_slots(event_type, data)
        if isinstance(messages, list):
            for message in messages:
                if _obj(message):
                    _no_wrapper(message.get("content"), subject)
    elif event_type == "compaction/summary":
        _no_wrapper(data.get("summary"), subject)
        _no_wrapper(data.get("rawOutput"), subject)
    elif event_type == "tool/ptc-dispatch":
        _no_wrapper(data.get("content"), subject)
    if event_type in ("assistant/message", "assistant/attempt"):
        for chunk in _stream_chunks(data):
            if chunk.get("type") == "block-end":
                _no_wrapper([chunk.get("block")], subject)
            if chunk.get("type") == "block-start" and chunk.get("blockType") == "tool-result":
                raise AdmissionError(f"{subject} must not contain a released tool-result wrapper")


def _js_string(value: Any) -> str:
    """``String(value)`` for the values a row may hold in these places."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, dict):
        return "[object Object]"
    if isinstance(value, list):
        return ",".join(_js_string(item) for item in value)
    return str(value)


# ------------------------------------------------------------- system message

def _require_obj(value: Any, subject: str) -> dict[str, Any]:
    if not _obj(value):
        raise AdmissionError(f"format v4 {subject} requires an object")
    return value


def _string(value: Any, subject: str, nonempty: bool = False) -> None:
    if type(value) is not str or (nonempty and not value):
        raise AdmissionError(f"format v4 {subject} requires a string{' with content' if nonempty else ''}")


def _positive(value: Any, subject: str) -> None:
    if _count(value, subject) == 0:
        raise AdmissionError(f"format v4 {subject} must be positive")


def _image(value: Any) -> None:
    attachment = _require_obj(value, "system image attachment")
    _string(attachment.get("attachmentId"), "system image attachmentId", True)
    if attachment.get("mediaType") not in ("image/png", "image/jpeg", "image/webp", "image/gif"):
        raise AdmissionError("format v4 system image requires a supported mediaType")
    _count(attachment.get("bytes"), "system image bytes")
    _positive(attachment.get("width"), "system image width")
    _positive(attachment.get("height"), "system image height")
    if "name" in attachment:
        _string(attachment["name"], "system image name")
    if "originalDimensions" in attachment:
        original = _require_obj(attachment["originalDimensions"], "system image originalDimensions")
        _positive(original.get("width"), "system image original width")
        _positive(original.get("height"), "system image original height")


def check_system_fields(row: dict[str, Any]) -> None:
    """dsh's ``assertV4SystemMessageFields``."""
    if row.get("type") != "system/message":
        return
    data = _require_obj(row.get("data"), "system/message data")
    _positive(data.get("turn"), "system/message turn")
    _positive(data.get("step"), "system/message step")
    message = _require_obj(data.get("message"), "system message")
    _string(message.get("id"), "system message id", True)
    if message.get("role") != "system":
        raise AdmissionError("format v4 system message requires system role")
    content = message.get("content")
    if not isinstance(content, list):
        raise AdmissionError("format v4 system message requires content array")
    for value in content:
        block = _require_obj(value, "system content block")
        _string(block.get("type"), "system content type", True)
        kind = block["type"]
        if kind in ("text", "reasoning"):
            _string(block.get("text"), "system content text")
        elif kind == "tool-call":
            _string(block.get("id"), "system tool-call id", True)
            _string(block.get("name"), "system tool-call name", True)
            _string(block.get("arguments"), "system tool-call arguments")
        elif kind == "image":
            _image(block.get("attachment"))
        elif kind == "tool-result":
            raise AdmissionError("format v4 system content rejects retired tool-result wrappers")


# ---------------------------------------------------------------- tool results

def check_tool_result(row: dict[str, Any]) -> None:
    """dsh's ``assertV4ToolResultMessage``: a first-class tool-role message."""
    if row.get("type") != "tool/result":
        return
    subject = f"format v4 tool/result at seq {_js_string(row.get('seq'))}"
    data = row.get("data")
    if not _obj(data):
        raise AdmissionError(f"{subject} data must be an object")
    message = data.get("message")
    if not _obj(message):
        raise AdmissionError(f"{subject} message must be an object")
    source = message.get("source")
    tool_call_id = message.get("toolCallId")
    if type(message.get("id")) is not str or not message["id"]:
        raise AdmissionError(f"{subject} requires a first-class message with a string id")
    if message.get("role") != "tool":
        raise AdmissionError(f"{subject} requires a tool-role message")
    if (type(tool_call_id) is not str or not tool_call_id
            or (source.get("callId") if _obj(source) else None) != tool_call_id):
        raise AdmissionError(f"{subject} requires toolCallId matching its tool source")
    if not _obj(source) or source.get("kind") != "tool":
        raise AdmissionError(f"{subject} requires a tool source")
    content = message.get("content")
    if not isinstance(content, list):
        raise AdmissionError(f"{subject} requires array content")
    _no_wrapper(content, f"{subject} content")
    if "isError" in message and type(message["isError"]) is not bool:
        raise AdmissionError(f"{subject} isError must be boolean when present")
    if "error" in data and message.get("isError") is not True:
        raise AdmissionError(f"{subject} carries error metadata for a non-error tool result")


_DIGITS = re.compile(r"(?:0|[1-9][0-9]*)")


def check_fork_result(row: dict[str, Any]) -> None:
    """dsh's ``assertV4ForkResult``: a fork's not-started tool result."""
    data = row.get("data")
    if row.get("type") != "tool/result" or not _obj(data):
        return
    error, message = data.get("error"), data.get("message")
    if (not _obj(error) or error.get("code") != "TOOL_NOT_STARTED" or not _obj(message)
            or type(message.get("id")) is not str or not message["id"].startswith("forked-tool-result-")):
        return
    source = message.get("source")
    call_id = source.get("callId") if _obj(source) else None
    prefix = f"forked-tool-result-{_js_string(call_id) if call_id is not None else 'undefined'}-"
    suffix = message["id"][len(prefix):]
    operation = row.get("surfaceOp")
    replacement = _obj(operation) and operation.get("op") == "replace"
    number = int(suffix) if _DIGITS.fullmatch(suffix) else None
    content = message.get("content")
    text = content[0] if isinstance(content, list) and len(content) == 1 else None
    sources = row.get("sourceEventSeqs")
    seq = row.get("seq")
    valid = (type(call_id) is str and message["id"].startswith(prefix) and number is not None
             and number <= MAX_SAFE_INTEGER
             and ((type(seq) is int and number < seq) if replacement else number == seq)
             and error.get("name") == "ToolNotStartedError"
             and (replacement or ("sourceEventSeqs" not in row and operation == "append"))
             and (not replacement or (isinstance(sources, list) and len(sources) == 1 and sources[0] == number))
             and message.get("role") == "tool" and message.get("isError") is True
             and message.get("toolCallId") == call_id and _obj(source) and source.get("kind") == "tool"
             and _obj(text) and text.get("type") == "text" and type(text.get("text")) is str)
    if not valid:
        raise AdmissionError("invalid V4 not-started fork result")


def _check_source_rows(row: dict[str, Any]) -> None:
    """dsh's ``assertV4SourceRowAdmission``: retired plugin sources, even in a malformed row."""
    data = row.get("data")
    if not _obj(data):
        return
    messages = message_slots(row.get("type"), data) if row.get("type") != "developer/message" else None
    if not isinstance(messages, list):
        return
    for message in messages:
        if _obj(message) and _obj(message.get("source")) and message["source"].get("kind") == "plugin":
            check_source(message)


def admit_row(row: Any) -> None:
    """dsh's ``assertV4RowAdmission`` on one parsed row (any JSON value)."""
    if not _obj(row):
        return
    check_developer_data(row)
    _check_source_rows(row)
    check_retired_syntax(row)
    check_system_fields(row)
    if row.get("type") == "tool/result":
        check_tool_result(row)
        check_fork_result(row)
