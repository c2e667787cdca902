"""When a session's events happened, by the log's own clock.

Every format dsh writes gives each event its time: Unix epoch ms at append,
the writer's wall clock (not monotonic, and never when the line was
shipped or read):

- **v0**: an event line's ``time``; a packed chunk row (``text-chunks``,
  ``reasoning-chunks``, ``tool-call-chunks``) its first member's ``time0``
  and the gaps ``data.dt`` to each next member, so its last member's time is
  ``time0 + sum(dt)``.
- **v3 and v4**: each row's ``time``; an ``assistant/message`` keeps its
  streamed chunks in ``data.stream``, each entry with its ``time`` or, for
  a packed run, ``time0``: the first entry is when the model's first chunk
  arrived.
- **the header** of every format: ``createdAt``.

:func:`line_time` reads one storage line of any of them (as written, or as
a record carries it) and says what kind of line it is, its first and last
event time, the turn and step its data names, and when its model output
began (a chunk line's own time; a v3/v4 message's first streamed chunk).
It reads only these fields; it checks nothing else (the fold does).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from .jsonvalue import MAX_SAFE_INTEGER

__all__ = ["LineTime", "line_time"]

#: v0's packed chunk rows and the chunk events they stand for.
_CHUNK_TYPES = frozenset({"assistant/chunk", "text-chunks", "reasoning-chunks", "tool-call-chunks"})


class LineTime(NamedTuple):
    """What :func:`line_time` read of one line (times in ms)."""

    type: str | None  # "session" for a header
    first: int  # the time of its first (or only) event; a header's createdAt
    last: int  # the time of its last event (a packed row's last member)
    turn: int | None  # the turn and step its data names
    step: int | None
    output_at: int | None  # when model output began: a chunk line's first time, a message's first streamed chunk


class _Stamp(msgspec.Struct):
    time: Any = None
    time0: Any = None


class _Data(msgspec.Struct):
    turn: Any = None
    step: Any = None
    dt: Any = None
    stream: list[_Stamp] | None = None


class _Line(msgspec.Struct):
    type: Any = None
    time: Any = None
    time0: Any = None
    createdAt: Any = None
    data: msgspec.Raw = msgspec.Raw(b"null")


_line_decoder = msgspec.json.Decoder(_Line)
_data_decoder = msgspec.json.Decoder(_Data)


def _ms(value: Any) -> int | None:
    return value if type(value) is int and abs(value) <= MAX_SAFE_INTEGER else None


def _number(value: Any) -> int | None:
    return value if type(value) is int else None


def line_time(line: bytes) -> LineTime | None:
    """The times of one storage line of any format (v0, v3, v4; an event,
    a packed chunk row or a header); ``None`` for a line that holds none
    (not JSON, not an object, no time)."""
    try:
        found = _line_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        data = _data_decoder.decode(found.data)
    except (msgspec.DecodeError, msgspec.ValidationError):  # data that is not an object names no step
        data = _Data()
    kind = found.type if isinstance(found.type, str) else None
    if kind == "session":
        created = _ms(found.createdAt)
        return None if created is None else LineTime(kind, created, created, None, None, None)
    first = _ms(found.time) if found.time is not None else _ms(found.time0)
    if first is None:
        return None
    last = first
    if found.time is None and isinstance(data.dt, list) and all(type(gap) is int for gap in data.dt):
        last = first + sum(data.dt)
    output_at = first if kind in _CHUNK_TYPES else None
    if data.stream:
        stamp = data.stream[0]
        output_at = _ms(stamp.time) if stamp.time is not None else _ms(stamp.time0)
    return LineTime(kind, first, last, _number(data.turn), _number(data.step), output_at)
