"""``image/offload``: the messages dsh's projection rewrites, its refusals,
the fold's snapshot holding the projection, and the request rebuilt after
an offload. dsh's own reading of these logs is compared in
``tests/differential/test_dsh_reader.py``."""

from __future__ import annotations

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_core.fold_snapshot import restore_fold, snapshot_fold
from dsh_core.formats import open_fold
from dsh_core.jsonvalue import encode_json, thaw
from dsh_core.loader import load_session_bytes
from dsh_core.formats.v4.images import ImageOffloadError
from dsh_core.formats.v4.wire import WireError, messages_body
from tests.oracle.image_logs import IMAGE_MUTATIONS, image_log

SOURCE = "/sessions/p/session-hand-images/session.v4.jsonl.zstd"


def _load(data: bytes, analysis: LogAnalysis | None = None):
    return load_session_bytes(data, source=SOURCE, compression="zstd", observer=analysis)


def _images(message) -> list:
    return [block.get("offloaded", False) for block in message["content"] if block["type"] == "image"]


def test_offloads_mark_the_images_they_name_on_top_of_earlier_ones():
    analysis = LogAnalysis(keep_requests=True)
    result = _load(image_log().encode(), analysis)
    assert result.accepted, result.error
    by_id = [{message["id"]: _images(message) for message in request["messages"] if _images(message)}
             for request in analysis.requests]
    assert by_id == [
        {"user-1": [False, False]},  # refused for its images
        {"user-1": [True, False]},
        {"user-1": [True, False], "tool-call_1": [False, False]},  # refused again
        {"user-1": [True, True], "tool-call_1": [True, False]},
        {"user-1": [True, True], "tool-call_1": [False], "user-2": [False]},  # a rewritten result starts afresh
        {"user-1": [True, True], "tool-call_1": [True], "user-2": [True]},
        {"summary-1": [False, False]},  # the compaction shadowed every offloaded node
        {"summary-1": [True, False]},
    ]
    offloaded = next(block for block in result.state.messages()[1]["content"] if block["type"] == "image")
    assert list(offloaded) == ["type", "attachment", "offloaded"]  # the key added last, as dsh spreads it


def test_an_offload_dsh_refuses_is_refused_by_name_with_session_and_seq():
    result = _load(IMAGE_MUTATIONS["offload_again"](image_log()))
    assert isinstance(result.error, ImageOffloadError) and result.error.category == "invalid-log"
    assert result.error.message.endswith(
        "session 'session-hand-images' seq 41 \"image/offload\": image/offload: image index 0 is already offloaded")
    result = _load(IMAGE_MUTATIONS["target_system"](image_log()))
    assert result.error.message.endswith(
        "seq 8 \"image/offload\": image/offload: target seq 3 must be user/message or tool/result")


def test_a_fold_saved_after_any_record_keeps_its_projections():
    """Restored with or without its surface events, at every record, the fold
    ends with the load's messages: the projections live in the snapshot."""
    lines = image_log().lines
    header = image_log().frames[0][0].encode()
    fold = open_fold(header, "restored")
    for index, line in enumerate(lines):
        rows = [(seq, *row) for seq, row in fold.state.surface_events().items()]
        before = encode_json(fold.state.messages())
        fold = restore_fold(snapshot_fold(fold, with_surface_events=index % 2 == 0), "restored", None, rows)
        assert encode_json(fold.state.messages()) == before, index
        fold.apply(line.encode())
        assert fold.error is None, fold.error
    fold.finish()
    assert encode_json(fold.state.messages()) == encode_json(_load(image_log().encode()).state.messages())
    assert any(True in _images(message) for message in fold.state.messages())


def _request(number: int):
    analysis = LogAnalysis(keep_requests=True)
    _load(image_log().encode(), analysis)
    request = analysis.requests[number]
    return thaw(request["header"]), thaw(request["context"]), thaw(request["messages"])


def _paths(attachment) -> str | None:
    return f"/a/{attachment['attachmentId'][7:]}.png" if "name" in attachment else None


def test_the_request_after_an_offload_sends_placeholders_for_the_offloaded_images():
    header, context, messages = _request(5)  # turn 2: every image so far offloaded
    body = messages_body(header, context, messages, image_path=_paths)
    first, *_, last = body["messages"]
    a_png = messages[1]["content"][1]["attachment"]["attachmentId"]
    assert first == {"role": "user", "content": [
        {"type": "text", "text": "compare these"},
        {"type": "text", "text": f'[image omitted to fit request image limits; "a.png" ({a_png}). Normalized copy '
                                 f'(read-only; may be resized or re-encoded): "/a/{a_png[7:]}.png" '
                                 "(64x48px, image/png). Source dimensions, format, and byte size may differ. Copy to a "
                                 "writable path ending in .png before editing.]"},
        {"type": "text", "text": "and"},
        {"type": "text", "text": "[image omitted to fit request image limits; "
                                 f"{messages[1]['content'][3]['attachment']['attachmentId']}. No local normalized "
                                 "image path is available; ask the user to attach it again if needed.]"}]}
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and [block["text"][:44] for block in result["content"]] == [
        "two shots, trimmed", '[image omitted to fit request image limits; "shot-2.gif"'[:44]]
    assert last["content"][1] == {"type": "text", "text": "and this one?"}


def test_a_request_still_holding_an_image_or_without_paths_is_not_rebuilt():
    header, context, messages = _request(1)  # a.png offloaded, b.jpg still sent as itself
    with pytest.raises(WireError, match="request content image is not rebuilt from the log"):
        messages_body(header, context, messages, image_path=_paths)
    with pytest.raises(WireError, match="pass image_path"):
        messages_body(*_request(5))
