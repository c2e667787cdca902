"""Fold snapshots the projector and the auditor of 72cba14 stored (pickles,
layout 2) restore, go on exactly as an uninterrupted fold, and are saved
again in the current layout, byte for byte what a fold that never stopped
saves. ``tests/fixtures/snapshots-72cba14/README.md`` says how they were made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zstandard

from dsh_core.analysis import LogAnalysis
from dsh_core.fold_snapshot import V4_SNAPSHOT_LAYOUT, V4_SNAPSHOT_MAGIC, restore_fold, snapshot_fold
from dsh_core.formats import open_fold
from dsh_core.jsonvalue import encode_json
from tests.unit.dsh_core.test_fold_snapshot_v4 import FIXTURES, stored_lines

SNAPSHOTS = sorted((FIXTURES / "snapshots-72cba14").glob("*.snapshot.zst"))
LOGS = {"tools-v4": "dsh-0.2.1/tools.v4.jsonl.zstd", "parallel-v4": "dsh-0.2.1/parallel.v4.jsonl.zstd",
        "compact-v3": "dsh-0.1.5/compact.v3.jsonl.zstd"}


class Audit:
    """Stands for the auditor's observer: its state is its own, not the snapshot's."""

    watched_types = frozenset()


def _outcome(fold) -> tuple:
    state = fold.state
    return (fold.count, encode_json(state.messages()), list(state.surface.nodes), state.surface.replace_generation,
            encode_json(state.header), encode_json(state.context), fold.idle, fold.error)


def _analysis(analysis: LogAnalysis) -> tuple:
    return analysis.turns, analysis.request_count, dict(analysis.usage), analysis.snapshot()


def old_snapshot(name: str) -> tuple[bytes, list[bytes], int, Any]:
    """The 72cba14 snapshot ``name`` (``tools-v4-projector``, ...): its bytes,
    its log's lines, the line it stopped before, and a fold that never
    stopped, folded up to there (by the role's observer)."""
    [path] = (FIXTURES / "snapshots-72cba14").glob(f"{name}.*.snapshot.zst")
    stop = int(path.name.split(".")[1])
    lines = stored_lines(FIXTURES / LOGS[name.rsplit("-", 1)[0]])
    fold = open_fold(lines[0], "session", observer(name))
    for line in lines[1:stop]:
        fold.apply(line)
    return zstandard.ZstdDecompressor().decompress(path.read_bytes()), lines, stop, fold


def observer(name: str) -> Any:
    return LogAnalysis(keep_requests=False) if name.endswith("-projector") else Audit()


def surface_rows(fold) -> list[tuple[int, str, Any]]:
    """The fold's current surface events, as the projector's surface table holds them."""
    return [(seq, *row) for seq, row in fold.state.surface_events().items()]


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda path: path.name.split(".")[0])
def test_a_72cba14_snapshot_restores_goes_on_identically_and_is_rewritten(path: Path):
    name = path.name.split(".")[0]
    projector = name.endswith("-projector")
    blob, lines, stop, never_stopped = old_snapshot(name)
    assert blob.startswith(V4_SNAPSHOT_MAGIC % 2)
    rows = surface_rows(never_stopped) if projector else None
    restored = restore_fold(blob, "session", observer(name), rows)

    assert _outcome(restored) == _outcome(never_stopped)
    rewritten = snapshot_fold(restored, with_surface_events=not projector)
    assert rewritten.startswith(V4_SNAPSHOT_MAGIC % V4_SNAPSHOT_LAYOUT) and b"dsh_core" not in rewritten
    assert rewritten == snapshot_fold(never_stopped, with_surface_events=not projector)

    again = restore_fold(rewritten, "session", observer(name), rows)
    for fold in (restored, again, never_stopped):
        for line in lines[stop:]:
            fold.apply(line)
        fold.finish()
    assert _outcome(restored) == _outcome(again) == _outcome(never_stopped)
    if projector:
        assert _analysis(restored.observer) == _analysis(again.observer) == _analysis(never_stopped.observer)


def test_every_role_and_format_has_a_snapshot():
    assert [path.name for path in SNAPSHOTS] == ["compact-v3-projector.24.snapshot.zst",
                                                 "parallel-v4-auditor.16.snapshot.zst",
                                                 "tools-v4-projector.14.snapshot.zst"]
