"""A session's derived messages as plain text, one line per content block,
the times readers show, and text made safe to print on a terminal."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

__all__ = ["format_time", "transcript_lines", "visible"]

#: Characters of one block shown (a transcript line, not the whole output).
_SHOWN = 2000
#: What starts each further line of a multi-line block (never a ``who:`` of its own).
_CONTINUED = "\n    "


def visible(text: Any, lines: bool = False) -> str:
    """``text`` as a terminal may print it: every character that is not
    printable (controls and escape sequences, bidi overrides and other
    format characters, line separators, lone surrogates) shown as its
    Python escape (``\\x1b``, ``\\u202e``), never as typed. With ``lines``
    a newline stays one, and the line after it is indented."""
    text = str(text)
    if text.isprintable():
        return text
    if lines:
        return _CONTINUED.join(visible(line) for line in text.split("\n"))
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def transcript_lines(messages: Iterable[dict[str, Any]]) -> Iterator[str]:
    """``who: text`` per content block: role (or ``tool <call id>``), the
    text, reasoning, tool call or tool result, cut to 2000 characters, as
    :func:`visible` shows it (a newline in a block indents its next line)."""
    for message in messages:
        source = message.get("source", {})
        who = message.get("role") if source.get("kind") != "tool" else f"tool {source.get('callId')}"
        for block in message.get("content", []):
            kind = block.get("type")
            if kind in ("text", "reasoning"):
                text = block["text"]
            elif kind == "tool-call":
                text = f"→ {block.get('name')}({block.get('arguments')})"
            elif kind == "tool-result":
                inner = [b.get("text", "") for b in block.get("content", []) if isinstance(b, dict)]
                text = ("error: " if block.get("isError") else "") + " ".join(inner)
            else:
                text = f"[{kind}]"
            label = f"{who} ({kind})" if kind == "reasoning" else who
            yield f"{visible(label)}: {visible(str(text)[:_SHOWN], lines=True)}"


def format_time(ms: Any) -> str:
    """Milliseconds since the epoch as ``YYYY-MM-DD HH:MM:SS UTC``; ``-``
    for none, and the number itself where no calendar date is (a log's
    time is whatever its writer put there): 0, what a writer whose clock
    was not set writes, is ``0 (no time set)``, never a day in 1970."""
    if ms is None:
        return "-"
    if ms == 0 and type(ms) is int:
        return "0 (no time set)"
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError, TypeError):
        return visible(ms)
