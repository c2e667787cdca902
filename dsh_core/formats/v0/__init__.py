"""The v0 session format (dsh 0.1.0–0.1.2): JSONL events and packed chunk
rows, read by the staged fold (:mod:`.fold`) with dsh 0.1's legacy upgrades
(:mod:`.legacy`) and crash repair (:mod:`.repair`); docs/formats/v0.md."""

from __future__ import annotations

from typing import Any

from ...session_header import parse_header_line
from ...storage.layout import log_name
from ..contract import FoldObserver, FoldOptions, Format, SnapshotCodec
from .fold import StagedFold
from .snapshot import FoldSnapshot, V0Snapshots, restore, save

__all__ = ["StagedFold", "V0Snapshots", "format_record"]


def _open(parsed: Any, line: bytes, where: str, observer: FoldObserver | None, options: FoldOptions) -> StagedFold:
    fold = StagedFold(where, observer)
    fold.header_value(parsed)
    return fold


def format_record(snapshots: SnapshotCodec) -> Format:
    """v0 as the registry lists it; its snapshots in the ``snapshots`` layout."""
    return Format(version=0, name="v0", file_name=log_name("none", 0), open=_open, read_header=parse_header_line,
                  wire="chat-completions", current=False, state_type=FoldSnapshot, save=save, restore=restore,
                  snapshots=snapshots)
