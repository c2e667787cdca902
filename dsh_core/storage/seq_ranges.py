"""Range-encoded ``sourceEventSeqs``, as dsh 0.1.2 stores them in v0 logs.

dsh 0.1.2 writes a strictly increasing ``sourceEventSeqs`` with every run of
three or more consecutive seqs as a ``[first, last]`` pair (``[[12, 30]]``,
``[4, [6, 9]]``); a list that is not increasing stays plain. Its reader
decodes a stored record's list before any session rule, as a storage
matter: a malformed list makes the line unparsable (a corrupt record under
the torn-tail rules), never an invalid log.

The session header does not say which release wrote a v0 log, so a list
without a pair is left as it is for the surface rules of docs/formats/v0.md §4.1 (what
0.1.0–0.1.1 wrote and their reader checks); a list with a pair is decoded
as 0.1.2 decodes it.
"""

from __future__ import annotations

from typing import Any

from ..errors import DecodeError
from ..jsonvalue import MAX_SAFE_INTEGER

__all__ = ["MAX_SOURCE_SEQS", "decode_source_seqs"]

#: The most seqs one stored ``sourceEventSeqs`` may stand for: a pair costs
#: a few bytes and expands to up to its event's seq, so without a bound one
#: small hostile record deep in a long log would build millions of entries.
#: (dsh 0.1.2 bounds it by the event's seq only; no message of a real log
#: comes near this: one message's stream deltas or one compaction's nodes.)
MAX_SOURCE_SEQS = 100_000


def _is_seq(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def decode_source_seqs(sources: Any, seq: int) -> Any:
    """The plain list a stored ``sourceEventSeqs`` of the event at ``seq``
    (the number of events before it in the log) stands for: a list holding
    ``[first, last]`` pairs expanded, anything else as it is. Raises
    :class:`DecodeError` naming what is malformed; at most ``seq`` entries
    are ever built (every source is a distinct earlier event)."""
    if type(sources) is not list or not any(type(entry) is list for entry in sources):
        return sources
    decoded: list[int] = []
    for entry in sources:
        if type(entry) is list:
            if len(entry) != 2 or not (_is_seq(entry[0]) and _is_seq(entry[1])):
                raise DecodeError(f"sourceEventSeqs range entries must be [start, end] pairs of non-negative safe "
                                  f"integers, got {entry!r}")
            start, end = entry
            if end < start:
                raise DecodeError(f"sourceEventSeqs ranges require start <= end, got {entry!r}")
            if len(decoded) + end - start + 1 > seq:
                raise DecodeError(f"sourceEventSeqs range {entry!r} exceeds its event sequence {seq}")
            if len(decoded) + end - start + 1 > MAX_SOURCE_SEQS:
                raise DecodeError(f"sourceEventSeqs ranges stand for more than {MAX_SOURCE_SEQS} seqs")
            decoded.extend(range(start, end + 1))
        else:
            if not _is_seq(entry):
                raise DecodeError(f"sourceEventSeqs must contain non-negative safe integers, got {entry!r}")
            if len(decoded) + 1 > seq:
                raise DecodeError(f"sourceEventSeqs exceed their event sequence {seq}")
            decoded.append(entry)
    if any(later <= earlier for earlier, later in zip(decoded, decoded[1:])):
        raise DecodeError(f"sourceEventSeqs ranges must be strictly increasing, got {sources!r}")
    return decoded
