"""A fold snapshotted midway and restored ends exactly like an uninterrupted one."""

from __future__ import annotations

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_core.checkpoint import restore_fold, snapshot_fold
from dsh_core.fold import StagedFold
from dsh_core.jsonvalue import encode_json
from dsh_core.storage.reader import load_session_bytes
from tests.conftest import corpus_logs


@pytest.mark.parametrize("log", corpus_logs("dsh-real")[::4], ids=lambda p: p.name[:60])
def test_snapshot_midway_resumes_identically(log):
    data = log.read_bytes()
    lines = [line for line in data.split(b"\n") if line]
    reference = LogAnalysis(keep_requests=False)
    whole = load_session_bytes(data, observer=reference)
    if not whole.accepted or whole.closers:
        pytest.skip("refused or repaired on load: nothing to resume")
    first = StagedFold("first", LogAnalysis(keep_requests=False))
    first.header_line(lines[0])
    half = max(1, len(lines) // 2)
    for line in lines[1:half]:
        first.apply(line)
    analysis = LogAnalysis(keep_requests=False)
    resumed = restore_fold(snapshot_fold(first), "resumed", analysis)
    for line in lines[half:]:
        resumed.apply(line)
    assert resumed.error is None
    assert encode_json(resumed.state.messages()) == encode_json(whole.state.messages())
    assert resumed.state.surface.nodes == whole.state.surface.nodes
    assert (analysis.turns, analysis.request_count, analysis.usage) == (reference.turns, reference.request_count,
                                                                         reference.usage)
