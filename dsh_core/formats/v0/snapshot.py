"""A v0 fold's snapshot: a :class:`FoldSnapshot`, as JSON.

It holds the session header, the count of folded events, the
:class:`~dsh_core.session.SessionState` (surface nodes, the data of current
surface events, request header and context), the open-turn state of crash
repair and, when the fold's observer is a
:class:`~dsh_core.analysis.LogAnalysis`, its analysis. Stage refusals are
not saved: a caller keeps a refused session's status itself.

The blob is JSON written by :func:`~dsh_core.jsonvalue.dump_json`, since
payloads are frozen JSON values msgspec alone cannot always write (a lone
surrogate), and read with ``JSON.parse`` semantics (:func:`decode_json`).
Evolution: a new layout gets a new :data:`FOLD_SNAPSHOT_VERSION`; within a
layout only msgspec's compatible changes (a new field with a default); a
blob of another version is refused with :class:`FormatUnsupportedError`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...analysis import AnalysisSnapshot
from ...errors import FormatUnsupportedError
from ...jsonvalue import dump_json, float_hook
from ...session import SessionState, SessionStateSnapshot
from ...session_header import SessionHeader
from ..contract import FoldObserver, SurfaceRows
from ..snapshots import read_struct
from .fold import StagedFold
from .repair import OpenTurnSnapshot, OpenTurnTracker

__all__ = ["FOLD_SNAPSHOT_VERSION", "FoldSnapshot", "V0Snapshots", "restore", "save"]

#: The one v0 snapshot layout this build writes and reads.
FOLD_SNAPSHOT_VERSION = 1


class FoldSnapshot(msgspec.Struct, frozen=True):
    """One v0 fold, as :class:`V0Snapshots` writes it."""

    version: int
    header: dict[str, Any] | None  # SessionHeader.to_dict(), or None before the header line
    count: int
    state: SessionStateSnapshot | None
    tracker: OpenTurnSnapshot
    analysis: AnalysisSnapshot | None = None


_decode = msgspec.json.Decoder(FoldSnapshot, float_hook=float_hook).decode


def save(fold: StagedFold, with_surface_events: bool) -> FoldSnapshot:
    """The state of ``fold`` (its analysis is the codec's to add)."""
    return FoldSnapshot(
        version=FOLD_SNAPSHOT_VERSION,
        header=fold.header.to_dict() if fold.header is not None else None,
        count=fold.count,
        state=fold.state.snapshot(with_surface_events) if fold.state is not None else None,
        tracker=fold.tracker.snapshot(),
    )


def restore(saved: FoldSnapshot, where: str, observer: FoldObserver | None,
            surface_events: SurfaceRows | None) -> StagedFold:
    """The fold :func:`save` saved, named ``where`` and watched by ``observer``."""
    fold = StagedFold(where, observer)
    fold.header = SessionHeader(**saved.header) if saved.header is not None else None
    fold.count = saved.count
    fold.state = SessionState.restore(saved.state, surface_events) if saved.state is not None else None
    fold.tracker = OpenTurnTracker.restore(saved.tracker)
    return fold


class V0Snapshots:
    """The v0 layout: a JSON object (no layout line)."""

    def matches(self, blob: bytes) -> bool:
        return blob.lstrip()[:1] == b"{"

    def write(self, state: FoldSnapshot, analysis: AnalysisSnapshot | None) -> bytes:
        return dump_json(msgspec.structs.replace(state, analysis=analysis))

    def read(self, blob: bytes, where: str,
             surface_events: SurfaceRows | None) -> tuple[FoldSnapshot, AnalysisSnapshot | None]:
        saved = read_struct(blob, where, _decode, FoldSnapshot, _refuse_version)
        _check_version(saved.version, where)
        return saved, saved.analysis


def _refuse_version(value: Any, where: str) -> None:
    """Another version is refused as such, not as a shape."""
    version = value.get("version") if isinstance(value, dict) else None
    if type(version) is int:
        _check_version(version, where)


def _check_version(version: int, where: str) -> None:
    if version != FOLD_SNAPSHOT_VERSION:
        raise FormatUnsupportedError(
            f"{where}: fold snapshot is version {version}, but this build writes and reads only "
            f"version {FOLD_SNAPSHOT_VERSION}")
