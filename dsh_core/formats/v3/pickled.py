"""v3/v4 fold snapshots of layouts 1 and 2, which earlier builds pickled:
read so that stored projector and auditor states resume, and written again
in the current layout by the next save (:mod:`dsh_core.formats.snapshots`).

A pickle names each class it builds by module path. :data:`MOVED_NAMES`
maps every ``(module, name)`` those layouts hold to the class or value it
is now (as eventsourcing's ``register_topic`` does), so a module that
moves or a class that is renamed changes this table, not stored state; a
pickle naming anything else is refused, and nothing outside the table is
ever imported or called.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Callable

import msgspec

from ...analysis import AnalysisSnapshot
from ...errors import DecodeError
from ...jsonvalue import FrozenDict, decode_json, freeze
from ...session_header import SessionHeader
from ..contract import SurfaceRows
from ..v4 import snapshot as v4_snapshot
from ..v4.lifecycle import Relationships, _Compaction
from ..v4.fold import V4Fold
from ..v4.lookback import ToolsBySeq
from ..v4.relationships import ABSENT, NO_SOURCE
from ..v4.session import V4State, _Surface
from . import snapshot as v3_snapshot
from .fold import V3Fold
from .snapshot import ERRORS

__all__ = ["MOVED_NAMES", "read_pickled"]

#: Where layouts 1 and 2 (builds up to 72cba14 and a little after) found each class or value they name.
MOVED_NAMES: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("msgspec._core", "UNSET"): msgspec.UNSET,
    ("dsh_core.jsonvalue", "FrozenDict"): FrozenDict,
    ("dsh_core.session_header", "SessionHeader"): SessionHeader,
    ("dsh_core.v4.v3", "V3Fold"): V3Fold,
    ("dsh_core.v4.load", "V4Fold"): V4Fold,
    ("dsh_core.v4.lifecycle", "Relationships"): Relationships,
    ("dsh_core.v4.lifecycle", "_Compaction"): _Compaction,
    ("dsh_core.v4.lookback", "ToolsBySeq"): ToolsBySeq,
    ("dsh_core.v4.session", "V4State"): V4State,
    ("dsh_core.v4.session", "_Surface"): _Surface,
    ("dsh_core.v4.relationships", "ABSENT"): ABSENT,
    ("dsh_core.v4.relationships", "NO_SOURCE"): NO_SOURCE,
    ("dsh_core.errors", "DshError"): ERRORS["DshError"],
    ("dsh_core.errors", "DecodeError"): ERRORS["DecodeError"],
    ("dsh_core.errors", "CorruptionError"): ERRORS["CorruptionError"],
    ("dsh_core.errors", "FormatUnsupportedError"): ERRORS["FormatUnsupportedError"],
    ("dsh_core.errors", "ValidationError"): ERRORS["ValidationError"],
    ("dsh_core.errors", "SurfaceError"): ERRORS["SurfaceError"],
    ("dsh_core.errors", "IdentityError"): ERRORS["IdentityError"],
    ("dsh_core.v4.images", "ImageOffloadError"): ERRORS["ImageOffloadError"],
    ("dsh_core.v4.relationships", "RelationshipError"): ERRORS["RelationshipError"],
    ("dsh_core.v4.admission", "AdmissionError"): ERRORS["AdmissionError"],
    ("dsh_core.v4.session", "AdoptionError"): ERRORS["AdoptionError"],
    ("dsh_core.v4.rows", "RowError"): ERRORS["RowError"],
    ("dsh_core.v4.v3", "_Refusal"): ERRORS["V3MigrationRefusal"],
}
# The keys are what those pickles say, and never change; a module that moves (dsh_core.v4 became
# dsh_core.formats.v4, v3 and migration) changes only the values' imports above.

#: The folds those layouts held, saved as the current layout saves them.
_SAVE: dict[type, Callable[[Any], Any]] = {V3Fold: v3_snapshot.save, V4Fold: v4_snapshot.save}

#: How the observer and the left-out surface events were referred to.
_OBSERVER, _SURFACE_EVENTS = "observer", "surface-events"


def read_pickled(body: bytes, where: str,
                 surface_events: SurfaceRows | None) -> tuple[Any, AnalysisSnapshot | None]:
    """The fold a layout 1 or 2 snapshot's ``body`` (after its first line)
    holds, as its current saved state, and its analysis. Raises
    :class:`DecodeError` naming ``where`` for a body that is not one (a
    class outside :data:`MOVED_NAMES` included)."""
    stream = io.BytesIO(body)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            try:
                return MOVED_NAMES[module, name]
            except KeyError:
                raise pickle.UnpicklingError(f"{module}.{name} is not part of a fold") from None

        def persistent_load(self, pid: Any) -> Any:
            if pid == _OBSERVER:
                return None  # the caller's observer watches the fold restored from the saved state
            if pid == _SURFACE_EVENTS:
                return {seq: (kind, freeze(data)) for seq, kind, data in surface_events or ()}
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")

    try:
        fold = Unpickler(stream).load()
    except Exception as exc:  # noqa: BLE001 - any failure means: not a snapshot this build reads
        raise DecodeError(f"{where}: not a fold snapshot: {type(exc).__name__}: {exc}") from None
    save = _SAVE.get(type(fold))
    if save is None:
        raise DecodeError(f"{where}: not a fold snapshot: it holds a {type(fold).__name__}, not a v3/v4 fold")
    state = save(fold)
    rest = stream.read()
    if not rest:
        return state, None
    try:
        return state, msgspec.convert(decode_json(rest), AnalysisSnapshot)
    except (DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"{where}: not a fold snapshot: its analysis: {exc}") from None
