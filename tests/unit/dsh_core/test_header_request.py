"""Request header fold and reconstruction (docs/formats/v0.md §6)."""

from __future__ import annotations

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import RequestHeaderError
from dsh_core.request_header import canonical_header, header_equals
from dsh_core.jsonvalue import canonical_json, encode_json, sha256_jcs
from dsh_core.request import MessagesDigest, build_request, request_digest, request_frame
from dsh_core.session import SessionLog
from dsh_core.session_header import SessionHeader
from dsh_core.loader import load_session_bytes
from dsh_core.storage.records import encode_records
from tests.unit.helpers import Clock, assistant, header_data, new_log, user

CONFIG = {"provider": "deepseek", "model": "deepseek-chat"}


def test_canonical_header_drops_empties_and_unknown_keys():
    assert canonical_header({"config": CONFIG, "system": "", "tools": [], "adapterDefaults": {}}) == {"config": CONFIG}
    assert canonical_header({"config": CONFIG, "messagePrefix": [1], "adapterDefaults": {"maxTokens": True}}) == {
        "config": CONFIG, "adapterDefaults": {"maxTokens": True}}


def test_latest_header_wins_entirely():
    log = new_log()
    log.append("turn/start", {"turn": 1})
    log.append("request/header", {"header": {"config": CONFIG, "system": "be brief"}, "reason": "initial"})
    assert log.request_header() == {"config": CONFIG, "system": "be brief"}
    log.append("request/header", {"header": {"config": CONFIG}, "reason": "change"})
    assert log.request_header() == {"config": CONFIG}
    log.append("request/context", {"provider": "deepseek", "model": "deepseek-chat", "contextWindow": 64000})
    assert log.request_context() == {"provider": "deepseek", "model": "deepseek-chat", "contextWindow": 64000}


def test_header_equality():
    base = {"config": CONFIG}
    assert not header_equals({"config": {**CONFIG, "stop": []}}, base)
    assert header_equals({"config": {**CONFIG, "stop": ["a"]}}, {"config": {**CONFIG, "stop": ["a"]}})
    tool_a = {"name": "ls", "description": "d", "parameters": {"type": "object"}}
    tool_b = {"description": "d", "name": "ls", "parameters": {"type": "object"}}
    assert not header_equals({**base, "tools": [tool_a]}, {**base, "tools": [tool_b]})
    assert header_equals({**base, "tools": [tool_a]}, {**base, "tools": [dict(tool_a)]})
    assert not header_equals({**base, "system": "x"}, base)
    assert not header_equals({**base, "adapterDefaults": {"maxTokens": True}}, base)


@pytest.mark.parametrize("header, match", [
    ({"config": {"provider": "deepseek"}}, "lacks provider/model"),
    ({"config": {**CONFIG, "reasoningEffort": ""}}, "reasoningEffort"),
    ({"config": CONFIG, "adapterDefaults": {"maxTokens": True}}, "config.maxTokens is absent"),
    ({"config": {**CONFIG, "maxTokens": 5}, "adapterDefaults": {"maxTokens": False}}, "must be true"),
])
def test_invalid_headers_rejected(header, match):
    with pytest.raises(RequestHeaderError, match=match):
        new_log().append("request/header", {"header": header, "reason": "initial"})


def test_retired_header_vocabulary_rejected_everywhere():
    log = new_log()
    with pytest.raises(RequestHeaderError, match="fallback"):
        log.append("request/header", header_data() | {"reason": "fallback"})
    with pytest.raises(RequestHeaderError, match="request/header-delta"):
        log.append("request/header-delta", {})
    with pytest.raises(RequestHeaderError):
        SessionLog("s", [{"type": "request/header-delta", "seq": 0, "time": 0, "data": {}}], clock=Clock())
    header = SessionHeader(id="s", createdAt=0, delegationDepth=0)
    stored = header.to_line() + b"\n" + encode_records([{"type": "mode/set", "seq": 0, "time": 0, "data": {}}])
    result = load_session_bytes(stored)
    assert isinstance(result.error, RequestHeaderError) and result.error.category == "invalid-log"


def _chunk(turn, step, chunk):
    return {"turn": turn, "step": step, "chunk": chunk}


def test_retry_after_compaction_sees_the_replacement():
    clock = Clock()
    log = SessionLog("s", clock=clock)
    log.append("turn/start", {"turn": 1})                                               # 0
    log.append("step/start", {"turn": 1, "step": 1})                                    # 1
    log.append("user/message", user("u1"), surface_op="append")                         # 2
    log.append("request/header", header_data())                                         # 3
    log.append("assistant/chunk", _chunk(1, 1, {"type": "finish", "reason": {"kind": "error", "failure": {
        "message": "too long", "code": "CONTEXT_WINDOW_EXCEEDED"}}}))                    # 4 attempt 1
    log.append("compaction/summary", {"summary": "s"})                                  # 5
    log.append("user/message", user("sum", "summary"), surface_op={"op": "replace", "start": 2, "end": 2},
               source_event_seqs=[2, 5])                                                # 6
    log.append("assistant/chunk", _chunk(1, 1, {"type": "text-delta", "index": 0, "text": "ok"}))  # 7 attempt 2
    log.append("assistant/chunk", _chunk(1, 1, {"type": "finish", "reason": {"kind": "stop"}}))   # 8
    log.append("assistant/message", assistant("a1"), surface_op="append", source_event_seqs=[7, 8])  # 9
    log.append("step/end", {"turn": 1, "step": 1})
    log.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    stored = log.header.to_line() + b"\n" + encode_records([e.to_dict() for e in log.events])
    analysis = LogAnalysis()
    result = load_session_bytes(stored, observer=analysis)
    assert result.accepted
    first, second = analysis.requests
    assert (first["attempt"], first["boundarySeq"], second["attempt"], second["boundarySeq"]) == (1, 4, 2, 7)
    assert [m["id"] for m in first["messages"]] == ["u1"]
    assert [m["id"] for m in second["messages"]] == ["sum"]


def test_request_and_digest_input():
    header = {"config": {**CONFIG, "maxTokens": 4096}, "adapterDefaults": {"maxTokens": True}, "system": "sys"}
    messages = [user("m1")]
    request = build_request(header, messages, "demo-1")
    assert request == {**CONFIG, "maxTokens": 4096, "messages": messages, "system": "sys", "sessionId": "demo-1"}
    assert canonical_json(request).startswith(b'{"maxTokens":4096,"messages":[')
    import hashlib
    assert request_digest(request) == hashlib.sha256(canonical_json(request)).hexdigest()
    # key order and integral floats do not change the digest
    assert request_digest(build_request({"config": {"model": "deepseek-chat", "provider": "deepseek", "maxTokens": 4096.0},
                                         "system": "sys"}, messages, "demo-1")) == request_digest(request)
    assert encode_json(request) != canonical_json(request)


@pytest.mark.parametrize("header", [
    {"config": {**CONFIG, "maxTokens": 4096}, "system": "sys", "tools": [{"name": "ls", "parameters": {}}]},
    {"config": {"model": "m", "provider": "p", "messages": ["ignored"], "z": 1.5, "\U0001f600": 1, "\uff61": 2}},
    {"config": {"n": 1, "messagez": True, "message": None}},  # keys sorting right around "messages"
])
def test_incremental_digest_equals_the_rebuilt_request(header):
    digest = MessagesDigest()
    frame = request_frame(header, "s-1")
    history = []
    for index in range(5):
        assert digest.of(history, 0, *frame) == request_digest(build_request(header, history, "s-1"))
        history.append(user(f"m{index}"))
    replaced = [assistant("summary")]  # a replace: new generation, the history starts over
    assert digest.of(replaced, 1, *frame) == request_digest(build_request(header, replaced, "s-1"))
    plain = MessagesDigest()
    assert plain.of(history, 0) == sha256_jcs(history)
