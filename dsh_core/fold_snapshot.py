"""Snapshots of a session's fold, so a consumer can evict a session from
memory and pick it up again later exactly where it was.

A snapshot is a :class:`FoldSnapshot`: the session header, the count of
folded events, the :class:`~dsh_core.session.SessionState` (surface nodes,
the data of current surface events, request header and context), the
open-turn state of crash repair and, when the fold's observer is a
:class:`~dsh_core.analysis.LogAnalysis`, its analysis. Stage refusals are
not saved: a caller keeps a refused session's status itself.

The blob is JSON written by :func:`~dsh_core.jsonvalue.dump_json`, since
payloads are frozen JSON values msgspec alone cannot always write (a lone
surrogate), and read with ``JSON.parse`` semantics (:func:`decode_json`).

Evolution: a new layout gets a new :data:`FOLD_SNAPSHOT_VERSION`; a blob of
any other version is refused with :class:`FormatUnsupportedError`, never
read by guesswork.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .analysis import AnalysisSnapshot, LogAnalysis
from .errors import DecodeError, FormatUnsupportedError
from .fold import FoldObserver, StagedFold
from .jsonvalue import decode_json, dump_json, float_hook
from .session import SessionState, SessionStateSnapshot
from .session_header import SessionHeader
from .storage.repair import OpenTurnSnapshot, OpenTurnTracker

__all__ = ["FOLD_SNAPSHOT_VERSION", "FoldSnapshot", "snapshot_fold", "restore_fold"]

#: The one snapshot layout this build writes and reads.
FOLD_SNAPSHOT_VERSION = 1


class FoldSnapshot(msgspec.Struct, frozen=True):
    """One fold, as :func:`snapshot_fold` writes it."""

    version: int
    header: dict[str, Any] | None  # SessionHeader.to_dict(), or None before the header line
    count: int
    state: SessionStateSnapshot | None
    tracker: OpenTurnSnapshot
    analysis: AnalysisSnapshot | None = None


_decode = msgspec.json.Decoder(FoldSnapshot, float_hook=float_hook).decode


def snapshot_fold(fold: StagedFold, with_surface_events: bool = True) -> bytes:
    """The fold as JSON. Without ``with_surface_events`` the data of the
    current surface events is left out (a caller that stores those rows
    itself passes them back to :func:`restore_fold`)."""
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
                 surface_events: list[tuple[int, str, Any]] | None = None) -> StagedFold:
    """A fold from :func:`snapshot_fold`; ``surface_events`` supplies the
    ``(seq, type, data)`` rows a snapshot made without them left out.
    ``observer`` is the fold's observer; a :class:`LogAnalysis` gets its
    saved state back. Raises :class:`FormatUnsupportedError` for a snapshot
    of another version and :class:`DecodeError` for a blob that is not a
    snapshot; ``where`` names the session in both."""
    saved = _read(blob, where)
    fold = StagedFold(where, observer)
    fold.header = SessionHeader(**saved.header) if saved.header is not None else None
    fold.count = saved.count
    fold.state = SessionState.restore(saved.state, surface_events) if saved.state is not None else None
    fold.tracker = OpenTurnTracker.restore(saved.tracker)
    if isinstance(observer, LogAnalysis) and saved.analysis is not None:
        observer.restore(saved.analysis)
    return fold


def _read(blob: bytes, where: str) -> FoldSnapshot:
    try:
        saved = _decode(blob)
    except msgspec.DecodeError:
        # Another version or no snapshot at all, or payloads only
        # decode_json reads (lone surrogate escapes): decode, then check.
        try:
            value = decode_json(blob)
        except DecodeError as exc:
            raise DecodeError(f"{where}: not a fold snapshot: {exc.message}") from None
        version = value.get("version") if isinstance(value, dict) else None
        if type(version) is int:
            _check_version(version, where)
        try:
            saved = msgspec.convert(value, FoldSnapshot)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"{where}: not a fold snapshot: {exc}") from None
    _check_version(saved.version, where)
    return saved


def _check_version(version: int, where: str) -> None:
    if version != FOLD_SNAPSHOT_VERSION:
        raise FormatUnsupportedError(
            f"{where}: fold snapshot is version {version}, but this build writes and reads only "
            f"version {FOLD_SNAPSHOT_VERSION}")
