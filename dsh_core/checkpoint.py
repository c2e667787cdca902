"""Snapshots of a session's fold, so a consumer can evict a session from
memory and pick it up again later exactly where it was.

A snapshot holds what later events need: the session header, the fold
(surface nodes and the data of current surface events, request header and
context), the open-turn state and the analysis (turns, usage, request
boundaries). It is JSON, written with dsh_core's own encoder.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .analysis import LogAnalysis
from .fold import StagedFold
from .jsonvalue import decode_json, dump_json, freeze
from .request import BoundaryTracker
from .session import SessionState
from .session_header import SessionHeader

__all__ = ["snapshot_fold", "restore_fold"]


def snapshot_fold(fold: StagedFold, with_surface_events: bool = True) -> bytes:
    """The fold as JSON. Without ``with_surface_events`` the data of the
    current surface events is left out (a caller that stores those rows
    itself passes them back to :func:`restore_fold`)."""
    state, tracker = fold.state, fold.tracker
    analysis = fold.observer if isinstance(fold.observer, LogAnalysis) else None
    data: dict[str, Any] = {
        "header": fold.header.to_dict() if fold.header else None,
        "count": fold.count,
        "state": {
            "nextSeq": state.next_seq, "lastTime": state.last_time, "nodes": state.surface.nodes,
            "replaceGeneration": state.surface.replace_generation,
            "surfaceEvents": ([[seq, kind, payload] for seq, (kind, payload) in state._surface_events.items()]
                              if with_surface_events else None),
            "header": state.header, "context": state.context,
        },
        "tracker": {"openTurn": tracker.open_turn, "openStep": tracker.open_step, "lastSeq": tracker.last_seq,
                    "lastTime": tracker.last_time,
                    "pending": [[call_id, step, call_seq] for call_id, (step, call_seq) in tracker.pending.items()]},
    }
    if analysis is not None:
        data["analysis"] = {
            "turns": analysis.turns, "steps": analysis.steps, "requests": analysis.request_count,
            "usage": [[provider, model, dict(totals)] for (provider, model), totals in analysis.usage.items()],
            "endReasons": dict(analysis.end_reasons),
            "boundaries": analysis.boundaries.to_json(),
        }
    return dump_json(data)


def restore_fold(blob: bytes, where: str, observer: Any,
                 surface_events: list[tuple[int, str, Any]] | None = None) -> StagedFold:
    """A fold from :func:`snapshot_fold`; ``surface_events`` supplies the
    ``(seq, type, data)`` rows a snapshot made without them left out.
    ``observer`` is the fold's observer; a :class:`LogAnalysis` gets its
    saved state back."""
    data = decode_json(blob)
    fold = StagedFold(where, observer)
    header = data["header"]
    fold.header = SessionHeader(**header) if header else None
    fold.count = data["count"]
    state = SessionState(fold.header.id if fold.header else "")
    saved = data["state"]
    state.next_seq, state.last_time = saved["nextSeq"], saved["lastTime"]
    state.surface.nodes = list(saved["nodes"])
    state.surface.replace_generation = saved["replaceGeneration"]
    rows = saved["surfaceEvents"] if saved["surfaceEvents"] is not None else surface_events or []
    state._surface_events = {seq: (kind, freeze(payload)) for seq, kind, payload in rows}
    state.header = freeze(saved["header"])
    state.context = freeze(saved["context"])
    fold.state = state
    tracker = data["tracker"]
    fold.tracker.open_turn, fold.tracker.open_step = tracker["openTurn"], tracker["openStep"]
    fold.tracker.last_seq, fold.tracker.last_time = tracker["lastSeq"], tracker["lastTime"]
    fold.tracker.pending = {call_id: [step, call_seq] for call_id, step, call_seq in tracker["pending"]}
    if isinstance(observer, LogAnalysis) and "analysis" in data:
        analysis = observer
        saved = data["analysis"]
        analysis.turns, analysis.steps, analysis.request_count = saved["turns"], saved["steps"], saved["requests"]
        analysis.usage = {(provider, model): Counter(totals) for provider, model, totals in saved["usage"]}
        analysis.end_reasons = Counter(saved["endReasons"])
        analysis.boundaries = BoundaryTracker.from_json(saved["boundaries"])
    return fold
