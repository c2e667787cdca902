"""The v4 session format (dsh 0.2.x), read exactly as dsh 0.2.1 reads it.

A v4 log is read by :class:`~.fold.V4Fold`: rows admitted (:mod:`.admission`)
and decoded (:mod:`.rows`), each event checked against the session
(:mod:`.relationships`, :mod:`.lifecycle`, :mod:`.lookback`) and folded
onto the surface (:mod:`.session`, images: :mod:`.images`). Its snapshot
state is :mod:`.snapshot`; :func:`~.wire.messages_body` rebuilds the
Messages request dsh sends at a boundary. docs/formats/v4.md.
"""

from __future__ import annotations

from typing import Any

from ...storage.layout import log_name
from ..contract import FoldObserver, FoldOptions, Format, SnapshotCodec
from .fold import V4Fold
from .header import parse_header
from .snapshot import V4FoldState, restore, save
from .wire import messages_body

__all__ = ["STATE", "V4Fold", "format_record", "messages_body"]

#: The fold's saved state (a Struct tagged ``v4``).
STATE = V4FoldState


def _open(parsed: Any, line: bytes, where: str, observer: FoldObserver | None, options: FoldOptions) -> V4Fold:
    fold = V4Fold(where, observer, folder=options.folder)
    fold.header_value(parsed)
    return fold


def format_record(snapshots: SnapshotCodec) -> Format:
    """v4 as the registry lists it; its snapshots in the ``snapshots`` layout."""
    return Format(version=4, name="v4", file_name=log_name("none", 4), open=_open, read_header=parse_header,
                  wire="messages", current=True, state_type=V4FoldState, save=save, restore=restore,
                  snapshots=snapshots)
