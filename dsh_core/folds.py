"""One fold interface over every session format.

A session's header line says its format; :func:`open_fold` reads it and
opens the fold of that format: :class:`~dsh_core.fold.StagedFold` for v0,
:class:`~dsh_core.v4.V4Fold` for v4, :class:`~dsh_core.v4.V3Fold` for v3
(migrated to v4 as dsh does). Every fold is fed the same way, a storage
line at a time (``event_line`` with a file's crash-tail rules, ``apply``
for a consumer's record at the next seq), and read the same way:
``header``, ``count`` (stored events folded), ``state`` (surface, derived
messages, request header and context), ``error`` (the refusal so far),
``idle`` (no turn open) and ``finish()``. Callers never branch on the
version; :mod:`dsh_core.fold_snapshot` saves and restores any of them.
"""

from __future__ import annotations

from typing import Any

from .errors import CorruptionError, DecodeError, FormatUnsupportedError
from .fold import FoldObserver, StagedFold
from .session import SessionState
from .jsonvalue import decode_json
from .session_header import SessionHeader, parse_header_line
from .v4.header import parse_header as parse_v4_header
from .v4.load import V4_VERSIONS, V4Fold
from .v4.session import V4State
from .v4.v3 import V3Fold

__all__ = ["FoldState", "SessionFold", "check_generation", "header_version", "open_fold", "opened_header", "opened_state",
           "read_header"]

SessionFold = StagedFold | V4Fold | V3Fold
#: What a fold's ``state`` is once it has read its header.
FoldState = SessionState | V4State


def opened_header(fold: SessionFold) -> SessionHeader:
    """The header of a fold :func:`open_fold` or a snapshot's restore gave
    (it has read one, so it is never ``None``)."""
    header = fold.header
    assert header is not None, "an opened fold has read its header"
    return header


def opened_state(fold: SessionFold) -> FoldState:
    """The state of a fold :func:`open_fold` or a snapshot's restore gave
    (made with its header, so it is never ``None``)."""
    state = fold.state
    assert state is not None, "an opened fold has a state"
    return state


def _decode_header(line: bytes, where: str) -> Any:
    try:
        return decode_json(line)
    except DecodeError as exc:
        raise CorruptionError(f"{where}: corrupt session log: header line is not valid JSON ({exc.message})") from None


def header_version(parsed: Any) -> Any:
    """The ``version`` of a decoded header line (``None`` when it has none)."""
    return parsed.get("version") if isinstance(parsed, dict) else None


def read_header(line: bytes, where: str, generation: int | None = None) -> SessionHeader:
    """A header line of any format this build reads, checked as its format's
    reader checks it, after the ``generation`` a file's name gives (raises
    :class:`CorruptionError` or :class:`FormatUnsupportedError` naming
    ``where``)."""
    parsed = _decode_header(line, where)
    version = header_version(parsed)
    check_generation(where, generation, version)
    if type(version) is int and version in V4_VERSIONS:
        return parse_v4_header(parsed, where)
    return parse_header_line(parsed, where)


def check_generation(where: str, generation: int | None, version: Any) -> None:
    """A file named for a generation (``session.v4.jsonl``) holds a header of
    that version; raises :class:`FormatUnsupportedError` otherwise."""
    if generation is not None and type(version) is int and version != generation:
        raise FormatUnsupportedError(f"{where}: session generation filename identifies v{generation}, but its "
                                     f"header identifies v{version}")


def open_fold(line: bytes, where: str, observer: FoldObserver | None = None, *, generation: int | None = None,
              folder: str | None = None, keep_migrated: bool = False) -> SessionFold:
    """The fold of the session whose header is ``line``, having read it.
    A file's name gives its ``generation`` (the header's version must be
    it) and its ``folder`` (a v3/v4 header's id must be the folder's);
    with ``keep_migrated`` a v3 fold keeps its events as migrated to v4."""
    parsed = _decode_header(line, where)
    version = header_version(parsed)
    check_generation(where, generation, version)
    if type(version) is int and version in V4_VERSIONS:
        versioned: V4Fold | V3Fold = (V4Fold(where, observer, folder=folder) if version == 4
                                      else V3Fold(where, observer, folder=folder, keep=keep_migrated))
        versioned.header_value(parsed)
        return versioned
    fold = StagedFold(where, observer)
    fold.header_line(line)
    return fold
