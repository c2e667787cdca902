"""The v3 session format (dsh 0.1.5), read as dsh 0.2.1 reads it: each row
checked as v3 (:mod:`.admission`), carried over by dsh's v3→v4 edge
(:mod:`.to_v4`, and :mod:`.catalog` at a migration's end) and folded by
the v4 fold (:class:`~.fold.V3Fold`). Its snapshot state is
:mod:`.snapshot`; layouts an earlier build pickled are read by
:mod:`.pickled`. docs/formats/v3.md.
"""

from __future__ import annotations

from typing import Any

from ...storage.layout import log_name
from ..contract import FoldObserver, FoldOptions, Format, SnapshotCodec
from ..v4.header import parse_header
from .fold import V3Fold
from .snapshot import V3FoldState, restore, save

__all__ = ["STATE", "V3Fold", "format_record"]

#: The fold's saved state (a Struct tagged ``v3``).
STATE = V3FoldState


def _open(parsed: Any, line: bytes, where: str, observer: FoldObserver | None, options: FoldOptions) -> V3Fold:
    fold = V3Fold(where, observer, folder=options.folder, keep=options.keep_migrated, children=options.children)
    fold.header_value(parsed)
    return fold


def format_record(snapshots: SnapshotCodec) -> Format:
    """v3 as the registry lists it; its snapshots in the ``snapshots`` layout."""
    return Format(version=3, name="v3", file_name=log_name("none", 3), open=_open, read_header=parse_header,
                  wire=None, current=False, state_type=V3FoldState, save=save, restore=restore,
                  snapshots=snapshots)
