"""Snapshots of a session's fold, so a consumer can evict a session from
memory and pick it up again later exactly where it was.

A v0 fold's snapshot is a :class:`FoldSnapshot`: the session header, the count of
folded events, the :class:`~dsh_core.session.SessionState` (surface nodes,
the data of current surface events, request header and context), the
open-turn state of crash repair and, when the fold's observer is a
:class:`~dsh_core.analysis.LogAnalysis`, its analysis. Stage refusals are
not saved: a caller keeps a refused session's status itself.

The blob is JSON written by :func:`~dsh_core.jsonvalue.dump_json`, since
payloads are frozen JSON values msgspec alone cannot always write (a lone
surrogate), and read with ``JSON.parse`` semantics (:func:`decode_json`).

A v3/v4 fold's snapshot is :data:`V4_SNAPSHOT_MAGIC` and a :class:`V4Snapshot`
as JSON: the fold's state as the versioned Structs of
:mod:`dsh_core.v4.snapshot` (tagged with the format; no module or class
names), the observer (and, on request, the current surface events) left
out and an analysis saved as a v0 fold's is. Layouts 1 and 2, which earlier
builds pickled, are still read (:mod:`dsh_core.pickled_snapshot`) and the
next save writes the current layout.

Evolution: a new layout gets a new :data:`FOLD_SNAPSHOT_VERSION` (v0) or
:data:`V4_SNAPSHOT_LAYOUT` (v3/v4); within a layout only msgspec's
compatible changes (a new field with a default); a blob of any other
version is refused with :class:`FormatUnsupportedError`, never read by
guesswork.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

import msgspec

from .analysis import AnalysisSnapshot, LogAnalysis
from .errors import CorruptionError, DecodeError, FormatUnsupportedError
from .fold import FoldObserver, StagedFold
from .folds import SessionFold
from .jsonvalue import STORED_DEPTH, decode_json, dump_json, float_hook
from .pickled_snapshot import restore_pickled
from .session import SessionState, SessionStateSnapshot
from .session_header import SessionHeader
from .storage.repair import OpenTurnSnapshot, OpenTurnTracker
from .v4 import snapshot as v4_snapshot

if TYPE_CHECKING:
    from .v4.load import V4Fold
    from .v4.v3 import V3Fold

__all__ = ["FOLD_SNAPSHOT_VERSION", "FoldSnapshot", "V4Snapshot", "V4_SNAPSHOT_LAYOUT", "is_pickled", "snapshot_fold",
           "restore_fold"]

T = TypeVar("T")

#: The one v0 snapshot layout this build writes and reads.
FOLD_SNAPSHOT_VERSION = 1
#: The v3/v4 snapshot layout this build writes (3: JSON of msgspec Structs) ...
V4_SNAPSHOT_LAYOUT = 3
#: ... and the pickled ones it still reads once (2: a v4 state keeps the messages image offloads projected;
#: 1: without them, as no log with an offload was read then) ...
_PICKLED_LAYOUTS = (1, 2)
#: ... behind this first line.
V4_SNAPSHOT_MAGIC = b"dsh-pipeline v4 fold snapshot, layout %d\n"


class FoldSnapshot(msgspec.Struct, frozen=True):
    """One fold, as :func:`snapshot_fold` writes it."""

    version: int
    header: dict[str, Any] | None  # SessionHeader.to_dict(), or None before the header line
    count: int
    state: SessionStateSnapshot | None
    tracker: OpenTurnSnapshot
    analysis: AnalysisSnapshot | None = None


_decode = msgspec.json.Decoder(FoldSnapshot, float_hook=float_hook).decode


def snapshot_fold(fold: SessionFold, with_surface_events: bool = True) -> bytes:
    """The fold as bytes. Without ``with_surface_events`` the data of the
    current surface events is left out (a caller that stores those rows
    itself passes them back to :func:`restore_fold`)."""
    if not isinstance(fold, StagedFold):
        return _snapshot_v4(fold, with_surface_events)
    analysis = fold.observer if isinstance(fold.observer, LogAnalysis) else None
    return dump_json(FoldSnapshot(
        version=FOLD_SNAPSHOT_VERSION,
        header=fold.header.to_dict() if fold.header is not None else None,
        count=fold.count,
        state=fold.state.snapshot(with_surface_events) if fold.state is not None else None,
        tracker=fold.tracker.snapshot(),
        analysis=analysis.snapshot() if analysis is not None else None,
    ))


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
    if blob.startswith(V4_SNAPSHOT_MAGIC.split(b"%d")[0]):
        return _surface_complete(_restore_v4(blob, where, observer, surface_events), where)
    saved = _read(blob, where)
    fold = StagedFold(where, observer)
    fold.header = SessionHeader(**saved.header) if saved.header is not None else None
    fold.count = saved.count
    fold.state = SessionState.restore(saved.state, surface_events) if saved.state is not None else None
    fold.tracker = OpenTurnTracker.restore(saved.tracker)
    if isinstance(observer, LogAnalysis) and saved.analysis is not None:
        observer.restore(saved.analysis)
    return _surface_complete(fold, where)


def is_pickled(blob: bytes) -> bool:
    """Whether ``blob`` is a v3/v4 snapshot an earlier build pickled (layout
    1 or 2): a store's migration restores it and saves it again."""
    return blob.startswith(tuple(V4_SNAPSHOT_MAGIC % layout for layout in _PICKLED_LAYOUTS))


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


# ------------------------------------------------------------------ v3 / v4


class V4Snapshot(msgspec.Struct, frozen=True):
    """A v3/v4 fold, as :func:`snapshot_fold` writes it after its layout line."""

    fold: v4_snapshot.FoldState
    analysis: AnalysisSnapshot | None = None


_decode_v4 = msgspec.json.Decoder(V4Snapshot, float_hook=float_hook).decode


def _snapshot_v4(fold: V4Fold | V3Fold, with_surface_events: bool) -> bytes:
    analysis = fold.observer if isinstance(fold.observer, LogAnalysis) else None
    saved = V4Snapshot(v4_snapshot.save(fold, with_surface_events),
                       analysis.snapshot() if analysis is not None else None)
    return V4_SNAPSHOT_MAGIC % V4_SNAPSHOT_LAYOUT + dump_json(saved)


def _restore_v4(blob: bytes, where: str, observer: FoldObserver | None,
                surface_events: list[tuple[int, str, Any]] | None) -> SessionFold:
    first, _, body = blob.partition(b"\n")
    if is_pickled(blob):
        return restore_pickled(body, where, observer, surface_events)
    if first + b"\n" != V4_SNAPSHOT_MAGIC % V4_SNAPSHOT_LAYOUT:
        raise FormatUnsupportedError(
            f"{where}: fold snapshot is {first.decode('ascii', 'replace')!r}, but this build reads only layouts "
            f"{', '.join(map(str, [*_PICKLED_LAYOUTS, V4_SNAPSHOT_LAYOUT]))}")
    saved = _read_json(body, where, _decode_v4, V4Snapshot)
    try:
        fold = v4_snapshot.restore(saved.fold, where, observer, surface_events)
    except (DecodeError, FormatUnsupportedError) as exc:
        raise type(exc)(f"{where}: fold snapshot of layout {V4_SNAPSHOT_LAYOUT}: {exc.message}") from None
    if isinstance(observer, LogAnalysis) and saved.analysis is not None:
        observer.restore(saved.analysis)
    return fold


def _read_json(blob: bytes, where: str, decode: Callable[[bytes], T], kind: type[T]) -> T:
    """``blob`` as a ``kind``; payloads only :func:`decode_json` reads (lone
    surrogate escapes) take the slower way. Raises :class:`DecodeError`."""
    try:
        return decode(blob)
    except msgspec.DecodeError:
        try:
            value = decode_json(blob, STORED_DEPTH)
        except DecodeError as exc:
            raise DecodeError(f"{where}: not a fold snapshot: {exc.message}") from None
        if kind is FoldSnapshot:  # another version is refused as such, not as a shape
            version = value.get("version") if isinstance(value, dict) else None
            if type(version) is int:
                _check_version(version, where)
        try:
            return msgspec.convert(value, kind)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"{where}: not a fold snapshot: {exc}") from None


def _read(blob: bytes, where: str) -> FoldSnapshot:
    saved = _read_json(blob, where, _decode, FoldSnapshot)
    _check_version(saved.version, where)
    return saved


def _check_version(version: int, where: str) -> None:
    if version != FOLD_SNAPSHOT_VERSION:
        raise FormatUnsupportedError(
            f"{where}: fold snapshot is version {version}, but this build writes and reads only "
            f"version {FOLD_SNAPSHOT_VERSION}")
