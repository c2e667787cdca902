"""A session a page at a time, by seq, so no read grows with the session.

A page is at most ``limit`` of the session's current surface events with a
seq above the cursor, in seq order, each with the derived message it
projects to (dsh's derivation), and the request header changes and
findings of the same seqs: those above the cursor, up to the last event
of the page (on the last page, to the end; a finding with no seq goes with
the first page). The cursor is a seq: ``next``, the seq of the page's last
event, or ``None`` on the last page. Concatenating the pages gives each
surface event, header change and finding of the session once.

A long text is a preview: each string of an event's data longer than
:data:`PREVIEW_CHARS` is cut to its first :data:`PREVIEW_CHARS`
characters, the event then carries ``"preview": {"size": n}`` (``n``: the
bytes of its whole data as JSON), and its derived message is cut alike.
The whole event is one read of its own (``surface_event``).

Messages come in seq order: after a compaction, the messages it kept
come before its summary (dsh's history puts the summary first); an image
offload's projection is not applied (the message is shown as logged).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from dsh_core.jsonvalue import encode_json
from dsh_core.v4.session import derive_message

__all__ = ["CURSOR", "PREVIEW_CHARS", "page_of", "preview", "within"]

#: What a cursor looks like: a seq.
CURSOR = re.compile(r"^-?[0-9]{1,19}$")
#: The characters of a string a page shows; a longer one is cut.
PREVIEW_CHARS = 4096


def preview(data: Any) -> tuple[Any, bool]:
    """``data`` with each string longer than :data:`PREVIEW_CHARS` cut, and
    whether one was."""
    if isinstance(data, str):
        return (data[:PREVIEW_CHARS], True) if len(data) > PREVIEW_CHARS else (data, False)
    if isinstance(data, dict):
        cut = False
        out = {}
        for key, value in data.items():
            out[key], shortened = preview(value)
            cut = cut or shortened
        return out, cut
    if isinstance(data, (list, tuple)):
        items = [preview(value) for value in data]
        return [value for value, _ in items], any(shortened for _, shortened in items)
    return data, False


def within(seq: Any, low: int | None, high: int | None) -> bool:
    """``low < seq <= high`` (``None``: from the start, to the end); a seq
    that is not a number goes with the first page."""
    if not isinstance(seq, int):
        return low is None
    return (low is None or seq > low) and (high is None or seq <= high)


def page_of(facts: dict[str, Any], rows: list[tuple[int, str, Any]], after: int | None, limit: int,
            header_changes: Iterable[dict[str, Any]], findings: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The page after ``after`` of a session: ``facts`` (its fields but the
    paged ones), ``rows`` its surface events ``(seq, type, data)`` above
    ``after`` in seq order (at least ``limit + 1`` of them when there are
    that many), ``header_changes`` and ``findings`` at least those of the
    page's seqs."""
    shown = rows[:limit]
    high = shown[-1][0] if len(rows) > limit else None
    surface, messages, seqs = [], [], {}
    for seq, kind, data in shown:
        event: dict[str, Any] = {"seq": seq, "type": kind}
        event["data"], cut = preview(data)
        if cut:
            event["preview"] = {"size": len(encode_json(data))}
        surface.append(event)
        message = derive_message(kind, event["data"])
        if message is not None:
            messages.append(message)
            if isinstance(message.get("id"), str):
                seqs[message["id"]] = seq
    return {**facts, "messages": messages, "messageSeqs": seqs, "surface": surface,
            "requestHeaderChanges": [c for c in header_changes if within(c.get("seq"), after, high)],
            "findings": [f for f in findings if within(f.get("seq"), after, high)],
            "next": str(high) if high is not None else None}


