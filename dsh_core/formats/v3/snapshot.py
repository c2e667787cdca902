"""A v3 fold's state as an explicit msgspec Struct, and back: the v3 rows'
edge and the v4 fold it feeds (:mod:`dsh_core.formats.v4.snapshot`), tagged
``v3``. The same evolution rules hold: a new field gets a default, a field
is never renamed or given another meaning, and an error class keeps its
key in :data:`ERRORS`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...errors import DshError
from ..contract import FoldObserver, SurfaceRows
from ..v4 import snapshot as v4
from ..v4.snapshot import Error, V4FoldState, error_of, exception_of
from .to_v4 import V3MigrationRefusal
from .fold import V3Fold

__all__ = ["ERRORS", "V3FoldState", "restore", "save"]

#: The errors a v3 fold may keep: the v4 fold's and the edge's refusal.
ERRORS: dict[str, type[DshError]] = {**v4.ERRORS, "V3MigrationRefusal": V3MigrationRefusal}
_NAMES = {cls: name for name, cls in ERRORS.items()}


class V3FoldState(msgspec.Struct, frozen=True, tag="v3", tag_field="format"):
    """A :class:`~dsh_core.formats.v3.fold.V3Fold`: the v3 rows' edge and the v4 fold it feeds."""

    v4: V4FoldState
    count: int
    line_no: int
    mapping: list[int]
    turn: int | None
    step_open: bool
    next_turn_spliced: bool
    foreign_delivery: int | None
    events: list[Any] | None  # every migrated event, when the fold keeps them
    issue: Error | None
    refusal: Error | None


def save(fold: V3Fold, with_surface_events: bool = True) -> V3FoldState:
    """The state of ``fold``; without ``with_surface_events`` the data of the
    current surface events is left out."""
    return V3FoldState(
        v4=v4.save(fold.v4, with_surface_events), count=fold.count, line_no=fold._line_no, mapping=list(fold._mapping),
        turn=fold._turn, step_open=fold._step_open, next_turn_spliced=fold._next_turn_spliced,
        foreign_delivery=fold._foreign_delivery, events=fold.events, issue=error_of(fold._issue, _NAMES),
        refusal=error_of(fold._refusal, _NAMES))


def restore(saved: V3FoldState, where: str, observer: FoldObserver | None,
            surface_events: SurfaceRows | None = None) -> V3Fold:
    """The fold :func:`save` saved (see :func:`dsh_core.formats.v4.snapshot.restore`)."""
    fold = V3Fold(where, observer, folder=saved.v4.folder)
    fold.v4 = v4.restore(saved.v4, where, observer, surface_events)
    fold.count, fold._line_no, fold._mapping, fold._turn = saved.count, saved.line_no, saved.mapping, saved.turn
    fold._step_open, fold._next_turn_spliced = saved.step_open, saved.next_turn_spliced
    fold._foreign_delivery, fold.events = saved.foreign_delivery, saved.events
    fold._issue, fold._refusal = exception_of(saved.issue, ERRORS), exception_of(saved.refusal, ERRORS)
    return fold
