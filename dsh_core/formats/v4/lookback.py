"""What later v4 events look back at: the toolset of each ``request/header``
(a ``developer/message``'s ``headerSeq``) and the human user messages a
session title cites. Kept per seq in a small form, so a long log costs
little: equal toolsets are one object, a user message is its source kind.
"""

from __future__ import annotations

from typing import Any

from ...jsonvalue import dump_json
from .relationships import NO_SOURCE, RelationshipError, _array, _earlier, _record

__all__ = ["NO_SOURCE", "ToolsBySeq", "check_title_sources"]



def _kind(kind: Any) -> Any:
    if kind is NO_SOURCE:
        raise RelationshipError("title input source requires an object")
    return kind


class ToolsBySeq:
    """The ``tools`` of each ``request/header`` by seq, a toolset shared by
    every header that repeats it (a long session logs one per turn)."""

    __slots__ = ("_by_seq", "_distinct")

    def __init__(self) -> None:
        self._by_seq: dict[int, Any] = {}
        self._distinct: dict[bytes, Any] = {}

    def add(self, seq: int, tools: Any) -> None:
        self._by_seq[seq] = self._distinct.setdefault(dump_json(tools), tools)

    def get(self, seq: int) -> Any:
        return self._by_seq.get(seq)

    def __contains__(self, seq: object) -> bool:
        return seq in self._by_seq


def check_title_sources(types: list[str], user_kinds: dict[int, Any], event: dict[str, Any], data: dict[str, Any]) -> None:
    references = _array(data.get("messageSeqs"), "title messageSeqs")
    if event["type"] == "session/title" and \
            (len(references) == 0) != (_record(data.get("source"), "title source").get("kind") == "user"):
        raise RelationshipError("session/title messageSeqs must be empty exactly for a user title")
    seen: set[int] = set()
    for value in references:
        seq = _earlier(value, event["seq"], "title messageSeqs")
        if (seq in seen or types[seq] != "user/message"
                or _kind(user_kinds[seq]) != "user"):
            raise RelationshipError(f"{event['type']} messageSeqs must cite distinct earlier human user/message events")
        seen.add(seq)
    if event["type"] != "session/title-llm-request":
        return
    messages = _array(data.get("messages"), "title messages")
    message = _record(messages[0] if messages else None, "title message")
    content = _array(message.get("content"), "title content")
    block = content[0] if content else None
    if (not references or len(messages) != 1 or message.get("role") != "user"
            or _record(message.get("source"), "title source").get("kind") != "dsh-session-title-llm"
            or len(content) != 1 or not isinstance(block, dict) or block.get("type") != "text"):
        raise RelationshipError("session/title-llm-request messages do not represent messageSeqs")
