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

A v3/v4 fold (:mod:`dsh_core.v4`) holds the lifecycle state of dsh's
relationship checks, many small structures that only the fold reads; its
snapshot is :data:`V4_SNAPSHOT_MAGIC` and the fold pickled, the observer
(and, on request, the current surface events) left out by reference. The
blob is the consumer's own state store's, never input from outside, and it
is read by an unpickler that builds nothing but this package's classes and
plain containers.

Evolution: a new layout gets a new :data:`FOLD_SNAPSHOT_VERSION` (v0) or
:data:`V4_SNAPSHOT_LAYOUT` (v3/v4; ``tests/unit/dsh_core/test_fold_snapshot_v4.py``
pins the attributes it saves); a blob of any other version is refused with
:class:`FormatUnsupportedError`, never read by guesswork.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import msgspec

from .analysis import AnalysisSnapshot, LogAnalysis
from .errors import CorruptionError, DecodeError, FormatUnsupportedError
from .fold import FoldObserver, StagedFold
from .folds import SessionFold
from .jsonvalue import STORED_DEPTH, decode_json, dump_json, float_hook, freeze
from .session import SessionState, SessionStateSnapshot
from .session_header import SessionHeader
from .storage.repair import OpenTurnSnapshot, OpenTurnTracker

__all__ = ["FOLD_SNAPSHOT_VERSION", "FoldSnapshot", "V4_SNAPSHOT_LAYOUT", "snapshot_fold", "restore_fold"]

#: The one v0 snapshot layout this build writes and reads.
FOLD_SNAPSHOT_VERSION = 1
#: The v3/v4 snapshot layout this build writes (2: a v4 state keeps the
#: messages image offloads projected) ...
V4_SNAPSHOT_LAYOUT = 2
#: ... and those it reads (1: without projected messages, as no log with an offload was read then) ...
_READ_V4_LAYOUTS = (1, 2)
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

_OBSERVER, _SURFACE_EVENTS = "observer", "surface-events"
#: What a v3/v4 snapshot may build besides this package's classes.
_BUILTINS = frozenset({("builtins", "set"), ("builtins", "frozenset"), ("msgspec._core", "UNSET")})


def _snapshot_v4(fold: SessionFold, with_surface_events: bool) -> bytes:
    observer = fold.observer
    left_out = None if with_surface_events else fold.state._events

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> str | None:
            if obj is observer and observer is not None:
                return _OBSERVER
            if obj is left_out and left_out is not None:
                return _SURFACE_EVENTS
            return None

    out = io.BytesIO()
    out.write(V4_SNAPSHOT_MAGIC % V4_SNAPSHOT_LAYOUT)
    Pickler(out, protocol=5).dump(fold)
    analysis = observer if isinstance(observer, LogAnalysis) else None
    return out.getvalue() + (dump_json(analysis.snapshot()) if analysis is not None else b"")


def _restore_v4(blob: bytes, where: str, observer: FoldObserver | None,
                surface_events: list[tuple[int, str, Any]] | None) -> SessionFold:
    first, _, body = blob.partition(b"\n")
    if first + b"\n" not in [V4_SNAPSHOT_MAGIC % layout for layout in _READ_V4_LAYOUTS]:
        raise FormatUnsupportedError(f"{where}: fold snapshot is {first.decode('ascii', 'replace')!r}, but this "
                                     f"build reads only layouts {', '.join(map(str, _READ_V4_LAYOUTS))}")
    stream = io.BytesIO(body)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module.startswith("dsh_core.") or (module, name) in _BUILTINS:
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a fold")

        def persistent_load(self, pid: Any) -> Any:
            if pid == _OBSERVER:
                return observer
            if pid == _SURFACE_EVENTS:
                return {seq: (kind, freeze(data)) for seq, kind, data in surface_events or ()}
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")

    try:
        fold = Unpickler(stream).load()
    except Exception as exc:  # noqa: BLE001 - any failure means: not a snapshot this build reads
        raise DecodeError(f"{where}: not a fold snapshot: {type(exc).__name__}: {exc}") from None
    rest = stream.read()
    if isinstance(observer, LogAnalysis) and rest:
        try:
            observer.restore(msgspec.convert(decode_json(rest), AnalysisSnapshot))
        except (DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(f"{where}: not a fold snapshot: its analysis: {exc}") from None
    return fold


def _read(blob: bytes, where: str) -> FoldSnapshot:
    try:
        saved = _decode(blob)
    except msgspec.DecodeError:
        # Another version or no snapshot at all, or payloads only
        # decode_json reads (lone surrogate escapes): decode, then check.
        try:
            value = decode_json(blob, STORED_DEPTH)
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
