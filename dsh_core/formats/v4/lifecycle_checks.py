"""The value checks of the v4 lifecycle pass (:mod:`.lifecycle`), as dsh
0.2.1 makes them: JavaScript's ``===`` over decoded JSON values, a number
equal to a turn or step counter, deep strict equality (``ABSENT`` only
equal to itself), and the result dsh writes for a tool call interrupted
before it was recorded as started."""

from __future__ import annotations

from typing import Any

from ...jsonvalue import MAX_SAFE_INTEGER, json_equal
from .relationships import ABSENT, _array, _record, _text

__all__: list[str] = []  # private: the checks .lifecycle makes

_INTERRUPTED_TEXT = ("The tool call was interrupted before the Harness recorded it as started. "
                     "Retry it if it is still needed.")


def _js_equal(a: Any, b: Any) -> bool:
    """JavaScript ``===`` over decoded JSON values (objects by identity)."""
    if a is ABSENT or b is ABSENT:
        return a is b
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return a is b
    if type(a) is bool or type(b) is bool:
        return a is b
    return a == b and (a is None) == (b is None)


def _same_int(value: Any, expected: int | None) -> bool:
    return type(value) in (int, float) and type(value) is not bool and value == expected


def _deep_equal(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return json_equal(a, b)


def _not_started_repair(event: dict[str, Any], data: dict[str, Any], message: dict[str, Any], call_id: str) -> bool:
    error = _record(data.get("error"), "not-started error")
    if (error.get("name") != "ToolNotStartedError" or error.get("code") != "TOOL_NOT_STARTED"
            or message.get("isError") is not True or "sourceEventSeqs" in event):
        return False
    message_id = _text(message.get("id"), "not-started message id")
    if message_id.startswith(f"forked-tool-result-{call_id}-"):
        return True
    prefix = f"interrupted-tool-result-{call_id}-"
    suffix = message_id[len(prefix):]
    content = _array(message.get("content"), "not-started content")
    block = content[0] if content else None
    return (message_id.startswith(prefix) and suffix.isascii() and suffix.isdigit()
            and (suffix == "0" or not suffix.startswith("0")) and int(suffix) <= MAX_SAFE_INTEGER
            and len(content) == 1 and isinstance(block, dict) and block.get("type") == "text"
            and block.get("text") == _INTERRUPTED_TEXT)
