"""A session's conversation a page at a time, so no answer grows with the
session: at most ``limit`` derived messages and about :data:`PAGE_BYTES`
of them (one message larger than that is a page of its own), with the
surface events, request header changes and findings of the same seqs.

The cursor is a seq: a message's key is the highest seq of the surface
events it and the messages before it come from (the list is not in seq
order: a compaction keeps older messages after its summary, and a message
with no surface event of its own has none), so keys never decrease. A page
holds the messages after the cursor: ``"S"`` (every message of key ``S``
or below was shown) or ``"S.N"`` (and the first ``N`` of key ``S``), the
form ``next`` takes (``None``: the last page). The surface events, header
changes and findings of a page are those whose seq is above the key of the
message before it, up to the key of its last message (on the last page, to
the end): each on one page.
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from dsh_core.jsonvalue import encode_json

__all__ = ["CURSOR", "PAGE_BYTES", "session_page"]

#: The bytes of messages past which a page ends (as JSON).
PAGE_BYTES = 1 << 20
_RANGED = ("surface", "requestHeaderChanges", "findings")  # lists of {"seq", ...}, kept for the page's seqs
#: What a cursor looks like.
CURSOR = re.compile(r"^-?[0-9]{1,19}(\.[0-9]{1,9})?$")


def session_page(session: dict[str, Any], after: str | None, limit: int) -> dict[str, Any]:
    """``session`` (as :meth:`ViewReader.session` gives it) with only the
    page of messages after the cursor ``after`` and ``next``, the cursor of
    the page after it."""
    keys = _message_keys(session)
    start = _start(keys, after)
    end, size = start, 0
    while end < len(keys) and end - start < limit and size < PAGE_BYTES:
        size += len(encode_json(session["messages"][end]))
        end += 1
    more = end < len(keys)
    low, high = keys[start - 1] if start else None, keys[end - 1] if more else None
    page = {**session, "messages": session["messages"][start:end], "next": _cursor(keys, end) if more else None}
    page["messageSeqs"] = {message["id"]: session["messageSeqs"][message["id"]] for message in page["messages"]
                           if message.get("id") in session["messageSeqs"]}
    for field in _RANGED:
        page[field] = [item for item in session.get(field) or () if _within(item.get("seq"), low, high)]
    return page


def _start(keys: list[int], after: str | None) -> int:
    if after is None:
        return 0
    key, _, shown = after.partition(".")
    first_above = bisect.bisect_right(keys, int(key))
    return min(bisect.bisect_left(keys, int(key)) + int(shown), first_above) if shown else first_above


def _cursor(keys: list[int], end: int) -> str:
    """The cursor of the page starting at ``end``."""
    key = keys[end - 1]
    return str(key) if keys[end] != key else f"{key}.{end - bisect.bisect_left(keys, key)}"


def _message_keys(session: dict[str, Any]) -> list[int]:
    """Each message's key: the highest seq of it and the messages before it."""
    keys, key = [], -1
    for message in session["messages"]:
        seq = session["messageSeqs"].get(message.get("id"))
        key = max(key, seq) if isinstance(seq, int) else key
        keys.append(key)
    return keys


def _within(seq: Any, low: int | None, high: int | None) -> bool:
    """``low < seq <= high`` (``None``: from the start, to the end); a seq
    that is not a number goes with the first page."""
    if not isinstance(seq, int):
        return low is None
    return (low is None or seq > low) and (high is None or seq <= high)
