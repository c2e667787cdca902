"""A fold snapshotted midway and restored ends exactly like an uninterrupted
one; snapshots of another version, or none at all, are refused."""

from __future__ import annotations

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DecodeError, FormatUnsupportedError
from dsh_core.formats.v0.fold import StagedFold
from dsh_core.fold_snapshot import FOLD_SNAPSHOT_VERSION, restore_fold, snapshot_fold
from dsh_core.jsonvalue import decode_json, dump_json, encode_json
from dsh_core.session_header import SessionHeader
from dsh_core.loader import load_session_bytes
from dsh_core.storage.records import encode_records
from tests.conftest import corpus_logs
from tests.unit.helpers import assistant, header_data, tool_result, user


@pytest.mark.parametrize("log", corpus_logs("dsh-real")[::4], ids=lambda p: p.name[:60])
def test_snapshot_midway_resumes_identically(log):
    data = log.read_bytes()
    lines = [line for line in data.split(b"\n") if line]
    reference = LogAnalysis(keep_requests=False)
    whole = load_session_bytes(data, observer=reference)
    if not whole.accepted or whole.closers:
        pytest.skip("refused or repaired on load: nothing to resume")
    first = StagedFold("first", LogAnalysis(keep_requests=False))
    first.header_value(decode_json(lines[0]))
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


def _calls(*ids: str) -> list[dict]:
    return [{"type": "tool-call", "id": call_id, "name": "ls", "arguments": "{}"} for call_id in ids]


def _session(text: str) -> tuple[list[bytes], int]:
    """Storage lines of a session (header first), and the index of the first
    line after the snapshot: there turn 1 and step 2 are open, call c2 is
    pending with its tool/call logged, and a tool/result replacement made
    generation 1."""
    chunk = {"type": "text-delta", "index": 0, "text": "x"}
    events = [
        ("request/header", header_data(), {}),
        ("request/context", {"provider": "deepseek", "model": "deepseek-chat"}, {}),
        ("turn/start", {"turn": 1}, {}),
        ("user/message", user("u1", text), {"surfaceOp": "append"}),
        ("step/start", {"turn": 1, "step": 1}, {}),
        *[("assistant/chunk", {"turn": 1, "step": 1, "chunk": chunk}, {})] * 3,
        ("assistant/message", assistant("a1", content=_calls("c1")), {"surfaceOp": "append"}),
        ("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "ls", "arguments": "{}"}, {}),
        ("tool/result", tool_result("r1", "c1"), {"surfaceOp": "append", "sourceEventSeqs": [9]}),
        ("tool/result", tool_result("r1", "c1", text="trimmed"),
         {"surfaceOp": {"op": "replace", "start": 10, "end": 10}, "sourceEventSeqs": [10]}),
        ("step/end", {"turn": 1, "step": 1}, {}),
        ("step/start", {"turn": 1, "step": 2}, {}),
        ("assistant/message", assistant("a2", step=2, content=_calls("c2")), {"surfaceOp": "append"}),
        ("tool/call", {"turn": 1, "step": 2, "callId": "c2", "name": "ls", "arguments": "{}"}, {}),
        # ---- snapshot here
        ("tool/result", tool_result("r2", "c2", step=2), {"surfaceOp": "append", "sourceEventSeqs": [15]}),
        ("step/end", {"turn": 1, "step": 2}, {}),
        ("step/start", {"turn": 1, "step": 3}, {}),
        ("assistant/message", assistant("a3", step=3, content=_calls("c3")), {"surfaceOp": "append"}),
    ]  # the log ends in the open turn, with c3 requested but not started
    records = [{"type": kind, "seq": seq, "time": 1000 + seq, "data": data, **envelope}
               for seq, (kind, data, envelope) in enumerate(events)]
    lines = encode_records(records).splitlines()  # the three chunks pack into one row
    header = SessionHeader(id="s", createdAt=1000, delegationDepth=0).to_line()
    return [header, *lines], len(lines) - 4 + 1


@pytest.mark.parametrize("with_surface_events", [True, False], ids=["with-surface-events", "surface-rows-apart"])
@pytest.mark.parametrize("text", ["hi", "lone \ud800 surrogate"], ids=["plain", "lone-surrogate"])
def test_mid_turn_snapshot_continues_like_the_uninterrupted_fold(text, with_surface_events):
    lines, split = _session(text)
    whole = StagedFold("whole", LogAnalysis(keep_requests=False))
    first = StagedFold("first", LogAnalysis(keep_requests=False))
    whole.header_value(decode_json(lines[0]))
    first.header_value(decode_json(lines[0]))
    for line in lines[1:split]:
        whole.apply(line)
        first.apply(line)
    assert (first.tracker.open_turn, first.tracker.open_step, first.tracker.pending) == (1, 2, {"c2": [2, 15]})
    assert first.state.surface.replace_generation == 1

    blob = snapshot_fold(first, with_surface_events=with_surface_events)
    rows = None if with_surface_events else [(seq, kind, data) for seq, (kind, data) in
                                             first.state.surface_events().items()]
    analysis = LogAnalysis(keep_requests=False)
    resumed = restore_fold(blob, "resumed", analysis, rows)
    assert snapshot_fold(resumed) == snapshot_fold(first)
    for line in lines[split:]:
        whole.apply(line)
        resumed.apply(line)
        assert snapshot_fold(resumed) == snapshot_fold(whole)

    assert resumed.error is None and whole.error is None
    assert resumed.count == whole.count == 20
    assert encode_json(resumed.state.messages()) == encode_json(whole.state.messages())
    assert (resumed.state.header, resumed.state.context) == (whole.state.header, whole.state.context)
    closers = resumed.finish()
    assert [closer["type"] for closer in closers] == ["tool/result", "step/end", "turn/end"]
    assert closers == whole.finish() and resumed.count == whole.count
    reference = whole.observer
    assert (analysis.turns, analysis.steps, analysis.request_count, analysis.usage, analysis.end_reasons) == (
        reference.turns, reference.steps, reference.request_count, reference.usage, reference.end_reasons)


def _blob() -> bytes:
    lines, split = _session("hi")
    fold = StagedFold("s", None)
    fold.header_value(decode_json(lines[0]))
    for line in lines[1:split]:
        fold.apply(line)
    return snapshot_fold(fold)


@pytest.mark.parametrize("layout", ["same", "changed"])
def test_a_snapshot_of_another_version_is_refused(layout):
    saved = decode_json(_blob())
    assert saved["version"] == FOLD_SNAPSHOT_VERSION == 1
    other = {**saved, "version": 2} if layout == "same" else {"version": 2, "fold": "elsewhere"}
    with pytest.raises(FormatUnsupportedError) as refused:
        restore_fold(dump_json(other), "session 's'", None)
    assert refused.value.message == ("session 's': fold snapshot is version 2, but this build writes and reads "
                                     "only version 1")


@pytest.mark.parametrize("blob", [b"", b"{not json", b"[]", b'{"version": "1"}', b'{"version": 1}',
                                  # the unversioned layout written before snapshots had a version
                                  b'{"header": null, "count": 0, "state": null, "tracker": {}}'])
def test_a_blob_that_is_no_snapshot_is_refused(blob):
    with pytest.raises(DecodeError, match=r"^session 's': not a fold snapshot: "):
        restore_fold(blob, "session 's'", None)
