"""One stored line of a v3/v4 log as an event (dsh 0.2.1's row decoder).

A row is an object with exactly ``type, seq, time, data`` and the optional
``ignorable`` (only ``true``), ``sourceEventSeqs`` and ``surfaceOp``. A
stored ``sourceEventSeqs`` is range-encoded: a run of three or more
consecutive seqs is written ``[first, last]``; a list that is not increasing
is kept plain. Decoding expands it and requires unique, earlier seqs.
"""

from __future__ import annotations

from typing import Any

from ...errors import CorruptionError
from ...jsonvalue import MAX_SAFE_INTEGER
from ...storage.seq_ranges import MAX_SOURCE_SEQS

__all__ = ["EVENT_KEYS", "decode_row", "decode_seq_ranges", "encode_seq_ranges"]

_REQUIRED = ("type", "seq", "time", "data")
EVENT_KEYS = frozenset(_REQUIRED + ("ignorable", "sourceEventSeqs", "surfaceOp"))


class RowError(CorruptionError):
    """A row this format does not hold (dsh's text, without the line)."""


def _count(value: Any, label: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise RowError(f"{label} must be a non-negative safe integer")
    return value


def decode_seq_ranges(value: Any, seq: int) -> list[int]:
    """The plain seqs a stored ``sourceEventSeqs`` of the event at ``seq`` stands for."""
    if type(value) is not list:
        raise RowError("sourceEventSeqs must be an array")
    out: list[int] = []
    has_range = False
    for entry in value:
        if type(entry) is not list:
            out.append(_count(entry, "sourceEventSeqs member"))
            continue
        if len(entry) != 2:
            raise RowError("sourceEventSeqs range must be a [start, end] pair")
        start = _count(entry[0], "sourceEventSeqs range start")
        end = _count(entry[1], "sourceEventSeqs range end")
        if start > end or end >= seq or end - start + 1 > seq - len(out) or len(out) + end - start + 1 > MAX_SOURCE_SEQS:
            raise RowError("sourceEventSeqs range exceeds its event seq")
        out.extend(range(start, end + 1))
        has_range = True
    if len(out) > seq or any(source >= seq for source in out) or len(set(out)) != len(out):
        raise RowError("sourceEventSeqs ranges must contain unique earlier seqs")
    if has_range and any(later <= earlier for earlier, later in zip(out, out[1:])):
        raise RowError("sourceEventSeqs ranges must be strictly increasing")
    return out


def encode_seq_ranges(values: list[int]) -> list[Any]:
    """The stored form of a plain ``sourceEventSeqs`` (the inverse of :func:`decode_seq_ranges`)."""
    if any(later <= earlier for earlier, later in zip(values, values[1:])):
        return list(values)
    out: list[Any] = []
    index = 0
    while index < len(values):
        start = end = values[index]
        while index + 1 < len(values) and values[index + 1] == end + 1:
            index += 1
            end += 1
        if end - start >= 2:
            out.append([start, end])
        else:
            out.extend(range(start, end + 1))
        index += 1
    return out


def decode_row(value: Any, row: int) -> dict[str, Any]:
    """Check one decoded row (the ``row``-th of the file, from 0) and
    return it with ``sourceEventSeqs`` expanded; raises :class:`RowError`."""
    if not isinstance(value, dict):
        raise RowError(f"released v2 row {row} must be an object")
    missing = next((key for key in _REQUIRED if key not in value), None)
    if missing is not None:
        raise RowError(f"released v2 row {row} lacks required field {missing}")
    extra = next((key for key in value if key not in EVENT_KEYS), None)
    if extra is not None:
        raise RowError(f"released v2 row {row} has unexpected field {extra}")
    if type(value["type"]) is not str:
        raise RowError(f"released v2 row {row} type must be a string")
    time = value["time"]
    if type(time) is not int or abs(time) > MAX_SAFE_INTEGER:
        raise RowError(f"released v2 row {row} time must be a safe integer")
    if "ignorable" in value and value["ignorable"] is not True:
        raise RowError(f"released v2 row {row} ignorable must be true when present")
    if "sourceEventSeqs" in value:
        seq = _count(value["seq"], f"released v2 row {row} seq")
        return {**value, "sourceEventSeqs": decode_seq_ranges(value["sourceEventSeqs"], seq)}
    return value
