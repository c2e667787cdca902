"""Storage codec: rows, framing, tails, repair, layout."""

from __future__ import annotations

import json

import pytest

from dsh_core.errors import CorruptionError, DecodeError, FormatUnsupportedError, LegacyShapeError, ValidationError
from dsh_core.jsonvalue import encode_json
from dsh_core.session_header import SessionHeader
from dsh_core.storage.framing import compress_frame
from dsh_core.storage.layout import encode_segment, find_session_files, log_path, project_key
from dsh_core.loader import load_session, load_session_bytes
from dsh_core.storage.records import decode_row, decode_row_line, encode_records, pack_chunk_runs
from dsh_core.formats.v0.repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT
from dsh_core.storage.writer import SessionFileWriter, commit_repair, encode_batch
from tests.unit.helpers import assistant

HEADER = SessionHeader(id="s", createdAt=1000, delegationDepth=0)
HEADER_LINE = HEADER.to_line() + b"\n"


def delta(seq, time, text="x", index=0, kind="text-delta", step=1):
    chunk = {"type": kind, "index": index, "text": text}
    return {"type": "assistant/chunk", "seq": seq, "time": time, "data": {"turn": 1, "step": step, "chunk": chunk}}


def tool_delta(seq, time, args, name=None):
    chunk = {"type": "tool-call-delta", "index": 0, "id": "c1"}
    if name is not None:
        chunk["name"] = name
    chunk["argumentsDelta"] = args
    return {"type": "assistant/chunk", "seq": seq, "time": time, "data": {"turn": 1, "step": 1, "chunk": chunk}}


def raw(*events, tail=b""):
    return HEADER_LINE + encode_records(list(events), pack=False) + tail


# ------------------------------------------------------------------- packing


def test_two_deltas_verbatim_three_pack():
    assert pack_chunk_runs([delta(0, 1), delta(1, 2)]) == [delta(0, 1), delta(1, 2)]
    (row,) = pack_chunk_runs([delta(0, 10, "a"), delta(1, 12, ""), delta(2, 11, "c")])
    assert row == {"type": "text-chunks", "seq0": 0, "time0": 10,
                   "data": {"turn": 1, "step": 1, "index": 0, "dt": [2, -1], "texts": ["a", "", "c"]}}
    assert decode_row(row).expand() == [delta(0, 10, "a"), delta(1, 12, ""), delta(2, 11, "c")]


def test_tool_deltas_named_first_then_packed_without_name():
    events = [tool_delta(0, 1, "{", name="ls"), tool_delta(1, 2, '"p"'), tool_delta(2, 3, ":1"), tool_delta(3, 4, "}")]
    first, row = pack_chunk_runs(events)
    assert first == events[0]
    assert row["type"] == "tool-call-chunks" and "name" not in row["data"] and row["data"]["args"] == ['"p"', ":1", "}"]
    assert decode_row(row).expand() == events[1:]


@pytest.mark.parametrize("breaker", [
    lambda e: e["data"]["chunk"].update(extra=1),
    lambda e: e.update(time=1.5),
    lambda e: e.update(ignorable=True),
])
def test_irregular_delta_breaks_the_run(breaker):
    events = [delta(i, i) for i in range(7)]
    breaker(events[3])
    records = pack_chunk_runs(events)
    assert [r["type"] for r in records] == ["text-chunks", "assistant/chunk", "text-chunks"]
    assert records[1] is events[3]


def test_runs_break_on_block_kind_and_seq():
    events = [delta(0, 0), delta(1, 0), delta(2, 0, index=1), delta(3, 0, kind="reasoning-delta"),
              delta(4, 0, kind="reasoning-delta"), delta(5, 0, kind="reasoning-delta")]
    assert [r["type"] for r in pack_chunk_runs(events)] == ["assistant/chunk"] * 3 + ["reasoning-chunks"]


ROW = {"type": "text-chunks", "seq0": 0, "time0": 5, "data": {"turn": 1, "step": 1, "index": 0, "dt": [1], "texts": ["a", "b"]}}


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r["data"].update(texts=[], dt=[]), "non-empty string array"),
    (lambda r: r["data"].update(dt=[]), "dt length 0 does not match 2 members"),
    (lambda r: r["data"].update(dt=[1.5]), "safe integers"),
    (lambda r: r["data"].update(extra=1), "exactly"),
    (lambda r: r.update(extra=1), "envelope"),
    (lambda r: r["data"].update(turn="1"), "numbers"),
    (lambda r: r.update(time0=2**53 - 1), "member times"),
    (lambda r: r.update(seq0=2**53 - 1), "member seqs"),
])
def test_malformed_rows(mutate, match):
    row = json.loads(json.dumps(ROW))
    mutate(row)
    with pytest.raises(DecodeError, match=match):
        decode_row(row)
    assert decode_row_line(json.dumps(row).encode()) is None  # the generic path names the problem


def test_one_member_row_decodes():
    row = {"type": "reasoning-chunks", "seq0": 3, "time0": 1, "data": {"turn": 1, "step": 1, "index": 0, "dt": [], "texts": ["x"]}}
    assert decode_row(row).expand() == [delta(3, 1, kind="reasoning-delta")]


# -------------------------------------------------------------------- header


@pytest.mark.parametrize("line", [
    {"type": "session", "version": 0, "id": "s", "createdAt": 1},
    {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": 1.5},
    {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": "1"},
    {"type": "session", "version": 0, "id": "s", "createdAt": -1, "delegationDepth": 0},
    {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": 0, "agentPreset": 7},
    {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": 0, "sandboxMode": "x"},
    42,
])
def test_bad_header_lines_are_corrupt(line):
    result = load_session_bytes(json.dumps(line).encode() + b"\n")
    assert isinstance(result.error, CorruptionError), result.error
    assert "line 1" in result.error.message


def test_negative_zero_delegation_depth_is_corrupt():
    result = load_session_bytes(b'{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":-0.0}\n')
    # -0 reads as 0 in JSON.parse; -0.0 with a fraction part is the same number
    assert result.accepted


def test_version_refusal_names_session_and_version():
    result = load_session_bytes(b'{"type":"session","version":42,"id":123}\n{garbage\n')
    assert isinstance(result.error, FormatUnsupportedError)
    assert "'123'" in result.error.message and "v42" in result.error.message


def test_stored_turn_end_shapes():
    def load_end(reason, **extra):
        end = {"type": "turn/end", "seq": 1, "time": 2, "data": {"turn": 1, "reason": reason, **extra}}
        return load_session_bytes(raw({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}, end))
    assert isinstance(load_end({"kind": "completed", "extra": True}).error, LegacyShapeError)
    assert isinstance(load_end({"kind": "completed"}, step=1).error, LegacyShapeError)
    assert load_end({"kind": "extension-reason"}).accepted


# ----------------------------------------------------------- tails and repair


def test_open_turn_gets_interrupted_closer():
    data = raw({"type": "turn/start", "seq": 0, "time": 7, "data": {"turn": 1}},
               {"type": "step/start", "seq": 1, "time": 8, "data": {"turn": 1, "step": 2}})
    result = load_session_bytes(data)
    assert result.accepted and [c["type"] for c in result.closers] == ["step/end", "turn/end"]
    assert result.closers[-1] == {"type": "turn/end", "seq": 3, "time": 8,
                                  "data": {"turn": 1, "reason": {"kind": "interrupted"}}}
    assert result.event_count == 4


def test_gap_or_garbage_before_a_turn_end_is_corrupt():
    start = {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}
    end = {"type": "turn/end", "seq": 2, "time": 1, "data": {"turn": 1, "reason": {"kind": "completed"}}}
    gap = load_session_bytes(raw(start, end))
    assert isinstance(gap.error, CorruptionError) and "expected 1, got 2" in gap.error.message
    garbage = load_session_bytes(HEADER_LINE + encode_records([start], pack=False) + b"{oops\n" + encode_records([end], pack=False))
    assert isinstance(garbage.error, CorruptionError) and "line 3" in garbage.error.message


def test_complete_log_with_torn_fragment():
    start = {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}
    end = {"type": "turn/end", "seq": 1, "time": 1, "data": {"turn": 1, "reason": {"kind": "completed"}}}
    result = load_session_bytes(raw(start, end, tail=b'{"partial'))
    assert result.accepted and result.closers == []
    assert (result.dropped_bytes, result.dropped_text) == (9, '{"partial')


def _tool_turn():
    call = assistant("a1", content=[{"type": "tool-call", "id": c, "name": "ls", "arguments": "{}"} for c in ("c1", "c2", "c3")])
    result_c1 = {"turn": 1, "step": 1, "message": {"id": "t1", "role": "user", "source": {"kind": "tool", "callId": "c1"},
                 "content": [{"type": "tool-result", "toolCallId": "c1", "content": []}]}}
    return [
        {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
        {"type": "step/start", "seq": 1, "time": 2, "data": {"turn": 1, "step": 1}},
        {"type": "assistant/message", "seq": 2, "time": 3, "data": call, "surfaceOp": "append"},
        {"type": "tool/call", "seq": 3, "time": 4, "data": {"turn": 1, "step": 1, "callId": "c1", "name": "ls", "arguments": "{}"}},
        {"type": "tool/result", "seq": 4, "time": 5, "data": result_c1, "surfaceOp": "append", "sourceEventSeqs": [3]},
        {"type": "tool/call", "seq": 5, "time": 6, "data": {"turn": 1, "step": 1, "callId": "c2", "name": "ls", "arguments": "{}"}},
    ]


def test_repair_closes_pending_calls():
    result = load_session_bytes(raw(*_tool_turn()))
    c2, c3, step_end, turn_end = result.closers
    assert c2["data"]["message"]["id"] == "interrupted-tool-result-c2-6" and c2["sourceEventSeqs"] == [5]
    assert c2["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert c2["data"]["message"]["content"][0]["content"][0]["text"] == OUTCOME_UNKNOWN_TEXT
    assert "sourceEventSeqs" not in c3 and c3["data"]["error"]["code"] == "TOOL_NOT_STARTED"
    assert c3["data"]["message"]["content"][0]["content"][0]["text"] == NOT_STARTED_TEXT
    assert {c["time"] for c in result.closers} == {6}
    assert (step_end["type"], turn_end["data"]["reason"]) == ("step/end", {"kind": "interrupted"})
    # closer key order is dsh's: surfaceOp before sourceEventSeqs
    assert encode_json(c2).endswith(b'"surfaceOp":"append","sourceEventSeqs":[5]}')


def test_unknown_types():
    start = {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}
    refused = load_session_bytes(raw(start, {"type": "future/x", "seq": 1, "time": 1, "data": {}}))
    assert isinstance(refused.error, FormatUnsupportedError) and '"future/x"' in refused.error.message
    kept = load_session_bytes(raw(start, {"type": "future/x", "seq": 1, "time": 1, "data": {}, "ignorable": True}))
    assert kept.accepted and kept.event_count == 3  # plus the turn/end closer


def test_stage_order_decides_the_category():
    # an invalid envelope (stage 6) at seq 1 and an unknown type (stage 4) at seq 2
    events = [{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
              {"type": "turn/start", "seq": 1, "time": 1.5, "data": {"turn": 2}},
              {"type": "future/x", "seq": 2, "time": 1, "data": {}}]
    assert load_session_bytes(raw(*events)).error.category == "unsupported-format"
    # a malformed legacy turn/end (stage 3) after that wins over both
    events.append({"type": "turn/end", "seq": 3, "time": 1, "data": {"turn": 0, "reason": {"kind": "completed"}}})
    assert isinstance(load_session_bytes(raw(*events)).error, LegacyShapeError)


# ---------------------------------------------------------------------- zstd


def zstd_file(*batches):
    return compress_frame(HEADER_LINE) + b"".join(compress_frame(encode_records(b)) for b in batches)


def test_zstd_round_trip_and_torn_last_frame(tmp_path):
    turn = [{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}]
    chunks = [delta(i, i) for i in range(1, 6)]
    data = zstd_file(turn, chunks)
    path = tmp_path / "session.jsonl.zstd"
    path.write_bytes(data)
    whole = load_session(path)
    assert whole.accepted and whole.event_count == 7 and not whole.dropped_bytes
    torn = zstd_file(turn) + compress_frame(encode_records(chunks, pack=False))[:-7]
    path.write_bytes(torn)
    result = load_session(path)
    assert result.accepted and result.dropped_bytes > 0
    assert 1 <= result.stored_count <= 6
    commit_repair(path, result)
    repaired = load_session(path)
    assert repaired.accepted and repaired.closers == [] and repaired.event_count == result.event_count


def test_zstd_corruptions():
    good = zstd_file([{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}])
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF  # checksum of the last complete frame
    assert isinstance(load_session_bytes(bytes(flipped), compression="zstd").error, CorruptionError)
    two_lines = compress_frame(HEADER_LINE + b'{"type":"x"}\n')
    assert "exactly one header line" in load_session_bytes(two_lines, compression="zstd").error.message
    assert "magic" in load_session_bytes(good + b"garbage!", compression="zstd").error.message


def test_writer_creates_appends_and_refuses_overwrite(tmp_path):
    path = log_path(tmp_path, "/home/u/proj", "s", "zstd")
    writer = SessionFileWriter(path, HEADER, "zstd")
    writer.append([{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}])
    writer.append([delta(i, i) for i in range(1, 5)] + [
        {"type": "turn/end", "seq": 5, "time": 9, "data": {"turn": 1, "reason": {"kind": "completed"}}}])
    with pytest.raises(ValidationError, match="append seq mismatch"):
        writer.append([delta(9, 9)])
    result = load_session(path)
    assert result.accepted and result.event_count == 6 and result.closers == []
    assert path.parent.name == "s" and path.parent.parent.name == "--home-u-proj--"
    with pytest.raises(Exception, match="refusing to overwrite"):
        SessionFileWriter(path, HEADER, "zstd").append([{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}])


def test_encode_batch_raw_is_the_jsonl_text():
    assert encode_batch([delta(0, 0)], "none") == encode_json(delta(0, 0)) + b"\n"


# -------------------------------------------------------------------- layout


@pytest.mark.parametrize("raw_id, encoded", [("a~b", "a~007Eb"), ("a/b", "a~002Fb"), ("é", "~00E9"),
                                            ("😀", "~D83D~DE00"), (".", "~002E"), ("..", "~002E~002E"), ("...", "...")])
def test_encode_segment(raw_id, encoded):
    assert encode_segment(raw_id) == encoded


def test_encode_segment_empty():
    with pytest.raises(ValidationError):
        encode_segment("")


@pytest.mark.parametrize("cwd, key", [("/", "--root--"), ("/home/u/proj", "--home-u-proj--"),
                                      ("C:\\work\\agent", "--C-work-agent--"), ("/a/b/", "--a-b---")])
def test_project_key(cwd, key):
    assert project_key(cwd) == key


def test_project_key_length():
    assert len(project_key("/" + "x" * 1000)) == 255
    assert project_key("/a/b-c") == project_key("/a-b/c")


def test_find_session_files_takes_the_newest_generation_and_refuses_what_the_layout_forbids(tmp_path):
    project = tmp_path / "--home-u-proj--"
    for name, files in (("s-1", ["session.jsonl"]), ("s-2", ["session.jsonl.zstd", "lock"]),
                        ("s-3", ["session.jsonl", "session.jsonl.zstd"]),
                        ("s-5", ["session.jsonl.zstd", "session.v4.jsonl.zstd", "session.lock"]),  # migrated by dsh
                        ("s-6", ["session.v3.jsonl.zstd", "session.v3.jsonl.zstd.1a2b.tmp"])):
        (project / name).mkdir(parents=True)
        for file in files:
            (project / name / file).write_bytes(b"")
    (project / "s-4.jsonl").write_bytes(b"")
    with pytest.raises(CorruptionError, match=r"s-3: holds both session.jsonl and session.jsonl.zstd"):
        find_session_files(tmp_path)
    refused: list[str] = []
    found = find_session_files(tmp_path, lambda error: refused.append(f"{type(error).__name__}: {error.message}"))
    assert found == [project / "s-1" / "session.jsonl", project / "s-2" / "session.jsonl.zstd",
                     project / "s-5" / "session.v4.jsonl.zstd", project / "s-6" / "session.v3.jsonl.zstd"]
    assert refused == [
        f"CorruptionError: {project / 's-3'}: holds both session.jsonl and session.jsonl.zstd",
        f"LayoutError: {project / 's-4.jsonl'}: a flat session file (dsh's obsolete layout); dsh keeps each session "
        "at <root>/<project>/<session-id>/session[.vN].jsonl[.zstd]"]
