"""Events whose fields have the wrong JSON type: the reader refuses them by
name (or accepts what dsh accepts); nothing raises past it."""

from __future__ import annotations

import json

import pytest

from dsh_core.errors import DshError
from dsh_core.loader import load_session_bytes
from tests.conftest import corpus_logs, expected_of


def _log() -> tuple[bytes, dict]:
    log = next(log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"]
               and expected_of(log)["repair"] is None)
    header, first = log.read_bytes().split(b"\n")[:2]
    return header, json.loads(first)


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda e: e | {"type": {"a": 1}}, "FormatUnsupportedError"),
    (lambda e: e | {"type": [1]}, "FormatUnsupportedError"),
    (lambda e: e | {"type": {"a": 1}, "ignorable": True}, "EnvelopeError"),
    (lambda e: {k: v for k, v in e.items() if k != "data"}, "EnvelopeError"),
    (lambda e: {"type": "request/header", "seq": 0, "time": e["time"], "data": {"system": 5, "tools": []}},
     "RequestHeaderError"),
    (lambda e: {"type": "request/header", "seq": 0, "time": e["time"], "data": {"system": [], "tools": "x"}},
     "RequestHeaderError"),
    (lambda e: e | {"type": "\ud800"}, "FormatUnsupportedError"),
])
def test_wrong_json_types_are_named_refusals(change, refusal):
    header, first = _log()
    line = json.dumps(change(first)).encode()
    result = load_session_bytes(header + b"\n" + line + b"\n", "case", "none")
    assert isinstance(result.error, DshError) and type(result.error).__name__ == refusal, result.error


def test_null_source_event_seqs_are_present_and_no_array():
    header, first = _log()
    message = {"type": "user/message", "seq": 0, "time": first["time"], "surfaceOp": "append",
               "data": {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}],
                        "source": {"kind": "user"}}}
    for sources, refusal in (([], "must not be empty except on assistant/message"),
                             (None, "sourceEventSeqs must be an array when present")):
        line = json.dumps(message | {"sourceEventSeqs": sources}).encode()
        result = load_session_bytes(header + b"\n" + line + b"\n", "case", "none")
        assert type(result.error).__name__ == "SurfaceError" and refusal in result.error.message, result.error
