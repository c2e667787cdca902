"""A session's derived messages as plain text, one line per content block,
and the times readers show."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

__all__ = ["format_time", "transcript_lines"]

#: Characters of one block shown (a transcript line, not the whole output).
_SHOWN = 2000


def transcript_lines(messages: Iterable[dict[str, Any]]) -> Iterator[str]:
    """``who: text`` per content block: role (or ``tool <call id>``), the
    text, reasoning, tool call or tool result, cut to 2000 characters."""
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
            yield f"{label}: {text[:_SHOWN]}"


def format_time(ms: Any) -> str:
    """Milliseconds since the epoch as ``YYYY-MM-DD HH:MM:SS UTC``; ``-``
    for none, and the number itself where no calendar date is (a log's
    time is whatever its writer put there)."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError, TypeError):
        return str(ms)
