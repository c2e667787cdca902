"""Snapshots of a session's fold, so a consumer can evict a session from
memory and pick it up again later exactly where it was.

A fold of any format is saved as its format says (:class:`~dsh_core.formats.Format`:
``save`` gives the fold's state as a msgspec Struct, ``snapshots`` the
layout it is written in): v0 as a :class:`~dsh_core.formats.v0.snapshot.FoldSnapshot`,
v3 and v4 behind a layout line as Structs tagged with their format
(:mod:`dsh_core.formats.snapshots`), no module or class name in either.
When the fold's observer is a :class:`~dsh_core.analysis.LogAnalysis`, its
analysis is saved beside the state; stage refusals of a v0 fold are not
saved (a caller keeps a refused session's status itself).

Layouts 1 and 2 of v3/v4, which earlier builds pickled, are still read
(:mod:`dsh_core.formats.v3.pickled`) and the next save writes the current
layout. Evolution: a new layout gets a new number; within a layout only
msgspec's compatible changes (a new field with a default); a blob of any
other version is refused with :class:`FormatUnsupportedError`, never read
by guesswork.
"""

from __future__ import annotations

from typing import Any

from .analysis import LogAnalysis
from .errors import CorruptionError, DecodeError, FormatUnsupportedError
from .formats import FORMATS, FoldObserver, SessionFold, format_of
from .formats.contract import SnapshotCodec
from .formats.registry import FALLBACK, TAGGED_SNAPSHOTS, V4_SNAPSHOT_MAGIC
from .formats.v0.snapshot import FOLD_SNAPSHOT_VERSION

__all__ = ["FOLD_SNAPSHOT_VERSION", "V4_SNAPSHOT_LAYOUT", "V4_SNAPSHOT_MAGIC", "is_pickled", "restore_fold",
           "snapshot_fold"]

#: The v3/v4 snapshot layout this build writes (3: JSON of msgspec Structs).
V4_SNAPSHOT_LAYOUT = TAGGED_SNAPSHOTS.layout
#: Each layout the registry's formats are saved in, once.
_CODECS: tuple[SnapshotCodec, ...] = tuple(dict.fromkeys(f.snapshots for f in FORMATS.values()))
#: Each saved state's format.
_BY_STATE = {f.state_type: f for f in FORMATS.values()}


def snapshot_fold(fold: SessionFold, with_surface_events: bool = True) -> bytes:
    """The fold as bytes. Without ``with_surface_events`` the data of the
    current surface events is left out (a caller that stores those rows
    itself passes them back to :func:`restore_fold`)."""
    kind = format_of(fold)
    analysis = fold.observer.snapshot() if isinstance(fold.observer, LogAnalysis) else None
    return kind.snapshots.write(kind.save(fold, with_surface_events), analysis)


def restore_fold(blob: bytes, where: str, observer: FoldObserver | None,
                 surface_events: list[tuple[int, str, Any]] | None = None) -> SessionFold:
    """A fold from :func:`snapshot_fold`; ``surface_events`` supplies the
    ``(seq, type, data)`` rows a snapshot made without them left out.
    ``observer`` is the fold's observer; a :class:`LogAnalysis` gets its
    saved state back. Raises :class:`FormatUnsupportedError` for a snapshot
    of another version and :class:`DecodeError` for a blob that is not a
    snapshot; ``where`` names the session in both; and
    :class:`CorruptionError` when ``surface_events`` lacks a row the
    snapshot's surface holds."""
    codec = next((codec for codec in _CODECS if codec.matches(blob)), FALLBACK.snapshots)
    state, analysis = codec.read(blob, where, surface_events)
    try:
        fold = _BY_STATE[type(state)].restore(state, where, observer, surface_events)
    except (DecodeError, FormatUnsupportedError) as exc:
        if codec is not TAGGED_SNAPSHOTS:
            raise
        raise type(exc)(f"{where}: fold snapshot of layout {V4_SNAPSHOT_LAYOUT}: {exc.message}") from None
    if isinstance(observer, LogAnalysis) and analysis is not None:
        observer.restore(analysis)
    return _surface_complete(fold, where)


def is_pickled(blob: bytes) -> bool:
    """Whether ``blob`` is a v3/v4 snapshot an earlier build pickled (layout
    1 or 2): a store's migration restores it and saves it again."""
    return TAGGED_SNAPSHOTS.is_legacy(blob)


def _surface_complete(fold: SessionFold, where: str) -> SessionFold:
    """``fold``, whose every surface node has its event (the rows a
    snapshot without them was handed back)."""
    if fold.state is not None:
        events = fold.state.surface_events()
        missing = [seq for seq in fold.state.surface.nodes if seq not in events]
        if missing:
            raise CorruptionError(f"{where}: its fold snapshot's surface holds seq {missing[0]}, but no surface row "
                                  f"of it was given ({len(missing)} missing)")
    return fold
