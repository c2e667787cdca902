"""A session a page at a time, by seq, so no read grows with the session.

A page is at most ``limit`` of the session's current surface events with a
seq above the cursor, in seq order (and fewer once they hold
:data:`PAGE_BYTES` of JSON, previews cut), each with the derived message it
projects to (dsh's derivation), and the request header changes and
findings of the same seqs: those above the cursor, up to the last event
of the page (on the last page, to the end; a finding with no seq goes with
the first page), and the turns the page's events name (those numbered
above the last turn an event before the page named, up to the last its
events name; on the first page from the first turn, on the last to the
end). The cursor is a seq: ``next``, the seq of the page's last
event, or ``None`` on the last page. Concatenating the pages gives each
surface event, header change and finding of the session once.

A long text is a preview: each string of an event's data longer than
:data:`PREVIEW_CHARS` is cut to its first :data:`PREVIEW_CHARS`
characters, the event then carries ``"preview": {"size": n}`` (``n``: the
bytes of its whole data as JSON), and its derived message is cut alike.
The whole event is one read of its own (``surface_event``).

Each event carries its ``time`` (the log's, ms; ``None`` for a row a store
of an older layout kept without it). The page's turns carry their
timings, and ``steps`` each step of those turns (:func:`timed_turns`).

Messages come in seq order; each event's ``order`` says where the
model sees it: the model's view is the events of order 0 in seq order,
then those of order 1, and so on (a compaction's summary stands where the
range it replaced was, before the messages it kept, which come at lower
seqs and may be on an earlier page). Sorting the concatenated pages' events
by ``(order, seq)`` gives dsh's history. An image offload's projection is
not applied (the message is shown as logged).
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable

from dsh_core.jsonvalue import encode_json
from dsh_core.formats.v4.session import derive_message

__all__ = ["NAMING_TURNS", "PAGE_BYTES", "PREVIEW_CHARS", "model_order", "page_of", "preview", "step_of", "timed_turns",
           "turn_of", "within"]

#: The surface events whose data names their turn.
NAMING_TURNS = ("assistant/message", "tool/result")
#: Below every turn number: where no event named a turn yet.
_NO_TURN = -(2 ** 63)
#: A step's token kinds, as its row holds them.
_TOKENS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
#: The characters of a string a page shows; a longer one is cut.
PREVIEW_CHARS = 4096
#: The bytes of surface events (as JSON, previews cut) past which a page ends.
PAGE_BYTES = 1 << 20


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


def model_order(nodes: list[int]) -> list[list[int]]:
    """A fold's surface nodes (seqs, in the model's order) as runs
    ``[first, last]`` in that order, each the current seqs from ``first``
    to ``last`` in seq order: one run while the model's order is the
    seqs', at most three more for each replace standing out of it (a
    break before it, after it, and between its neighbours in seq order)."""
    rank = {seq: index for index, seq in enumerate(sorted(nodes))}
    runs: list[list[int]] = []
    for seq in nodes:
        if runs and rank[seq] == rank[runs[-1][1]] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return runs


def turn_of(data: Any) -> int | None:
    """The turn a surface event's data names (a user message names none)."""
    turn = data.get("turn") if isinstance(data, dict) else None
    return turn if isinstance(turn, int) and not isinstance(turn, bool) else None


def within(seq: Any, low: int | None, high: int | None) -> bool:
    """``low < seq <= high`` (``None``: from the start, to the end); a seq
    that is not a number goes with the first page."""
    if not isinstance(seq, int):
        return low is None
    return (low is None or seq > low) and (high is None or seq <= high)


def step_of(row: Iterable[Any]) -> dict[str, Any]:
    """A stored step row (:data:`~.timings.STEP_COLUMNS`) as the API gives
    it: its event times, how long it took and took to its first output
    (``None`` where a time is missing), its model and tokens."""
    turn, step, started, output, ended, provider, model, *tokens = row
    return {"turn": turn, "step": step, "startedAt": started, "firstOutputAt": output, "endedAt": ended,
            "durationMs": ended - started if started is not None and ended is not None else None,
            "timeToFirstOutputMs": output - started if started is not None and output is not None else None,
            "provider": provider, "model": model, **dict(zip(_TOKENS, tokens))}


def timed_turns(turns: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` with their timings from their ``steps`` (:func:`step_of`):
    from the first step's start to the last step's end, and their tokens."""
    timed = []
    for turn in turns:
        own = [step for step in steps if step["turn"] == turn.get("turn")]
        starts = [step["startedAt"] for step in own if step["startedAt"] is not None]
        ends = [step["endedAt"] for step in own if step["endedAt"] is not None]
        started, ended = min(starts, default=None), max(ends, default=None)
        timed.append({**turn, "startedAt": started, "endedAt": ended,
                      "durationMs": ended - started if started is not None and ended is not None else None,
                      "tokens": sum(step[kind] for step in own for kind in _TOKENS)})
    return timed


def page_of(facts: dict[str, Any], rows: list[tuple[int, str, Any, int | None]], after: int | None, limit: int,
            header_changes: Iterable[dict[str, Any]], findings: Iterable[dict[str, Any]],
            turns: Iterable[dict[str, Any]], turn_before: int | None,
            runs: list[list[int]] | None = None) -> dict[str, Any]:
    """The page after ``after`` of a session: ``facts`` (its fields but the
    paged ones), ``rows`` its surface events ``(seq, type, data)`` above
    ``after`` in seq order with their event time (at least ``limit + 1`` of them when there are
    that many), ``header_changes`` and ``findings`` at least those of the
    page's seqs, ``turns`` its turns and ``turn_before`` the :func:`turn_of`
    the last event at or before ``after`` that names one, and ``runs`` the
    view's :func:`model_order` (``None``: the seqs' order is the model's)."""
    firsts = sorted((first, last, place) for place, (first, last) in enumerate(runs or [[0, 2 ** 63]]))
    surface, messages, seqs, size = [], [], {}, 0
    for seq, kind, data, time in rows[:limit]:
        if size >= PAGE_BYTES:
            break
        at = bisect.bisect_right(firsts, (seq, 2 ** 64)) - 1
        order = firsts[at][2] if at >= 0 and firsts[at][1] >= seq else None
        event: dict[str, Any] = {"seq": seq, "type": kind, "time": time, "order": order}
        event["data"], cut = preview(data)
        if cut:
            event["preview"] = {"size": len(encode_json(data))}
        size += len(encode_json(event["data"]))
        surface.append(event)
        message = derive_message(kind, event["data"])
        if message is not None:
            messages.append(message)
            if isinstance(message.get("id"), str):
                seqs[message["id"]] = seq
    more = len(rows) > len(surface)
    high = surface[-1]["seq"] if more else None
    numbered = [turn for turn in (turn_of(event["data"]) for event in surface) if turn is not None]
    low_turn = None if after is None else turn_before if turn_before is not None else _NO_TURN
    high_turn = max(numbered, default=low_turn if low_turn is not None else _NO_TURN) if more else None
    return {**facts, "messages": messages, "messageSeqs": seqs, "surface": surface,
            "requestHeaderChanges": [c for c in header_changes if within(c.get("seq"), after, high)],
            "findings": [f for f in findings if within(f.get("seq"), after, high)],
            "turns": [t for t in turns if within(t.get("turn"), low_turn, high_turn)],
            "next": str(high) if high is not None else None}


