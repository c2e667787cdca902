"""JSON nested deeper than :data:`MAX_DEPTH` is one named refusal everywhere:
the decoder, every reader (v0 lines and packed rows, v3, v4), ``inspect``
and the three services' record paths. It is checked before anything
recurses, so no depth reaches a ``RecursionError``; a value nested at the
limit is read as any other."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest
import zstandard

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.auditor.findings import lossless_problem
from consumers.projector import Projection, ProjectorConfig
from dsh_core.errors import CorruptionError, DecodeError
from dsh_core.json_depth import MAX_DEPTH, check_depth
from dsh_core.jsonvalue import decode_json
from dsh_core.loader import load_session_bytes
from dsh_core.formats.v4.wire import WireError, messages_body
from dsh_core.wire_request import normalize
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord
from tests.conftest import corpus_logs, expected_of
from tests.policy_driver import KAFKA, NAMES, fetched, run_batch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
#: the limit, just past it, past msgspec's own recursion and far past it
DEPTHS = [MAX_DEPTH + 1, 500, 950, 5000, 100_000]
TOO_DEEP = f"arrays and objects nested more than {MAX_DEPTH} deep"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_the_decoder_takes_the_limit_and_refuses_one_more():
    assert decode_json(nested(MAX_DEPTH)) is not None
    assert decode_json(b'{"a": "' + b"[" * 1000 + b'", "b": "\\\\\\"[["}') == {"a": "[" * 1000, "b": '\\"[['}
    for data in (nested(MAX_DEPTH + 1), nested(MAX_DEPTH + 1).decode(), msgspec.Raw(nested(MAX_DEPTH + 1)),
                 b"[" * 100_000, b'{"a":' * 200 + b"1" + b"}" * 200):
        with pytest.raises(DecodeError, match=TOO_DEEP):
            decode_json(data)
    with pytest.raises(DecodeError, match=TOO_DEEP):
        check_depth(b"[[" + b"[]" * 10_000 + b"[" * MAX_DEPTH)  # unbalanced: every open bracket counts
    check_depth(10**15)  # no text at all (tool-call arguments may be anything): left to the decoder, not bytes(n)


def _lines(path: Path) -> list[bytes]:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes()), read_across_frames=True) as raw:
        return raw.read().split(b"\n")[:-1]


def _logs() -> dict[str, tuple[str, list[bytes]]]:
    """A real log of every format: (its path as a reader sees it, its lines)."""
    v0 = next(log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"] and expected_of(log)["repair"]
              is None and b'-chunks"' in log.read_bytes())
    out = {"v0": ("/s/session.jsonl", v0.read_bytes().split(b"\n")[:-1])}
    for name, path in (("v3", FIXTURES / "dsh-0.1.5/tools.v3.jsonl.zstd"), ("v4", FIXTURES / "dsh-0.2.1/tools.v4.jsonl.zstd")):
        lines = _lines(path)
        out[name] = (f"/s/p/{json.loads(lines[0])['id']}/session.{name}.jsonl", lines)
    return out


LOGS = _logs()


def _deepened(lines: list[bytes], depth: int, row: bool) -> tuple[list[bytes], int]:
    """The log with a value ``depth`` deep (as a line counts it) in the first
    event line (packed row or not) that a later ``turn/end`` follows."""
    index = next(i for i, line in enumerate(lines) if i and (b'-chunks"' in line) == row)
    return lines[:index] + [lines[index][:-1] + b',"deep":' + nested(depth - 1) + b"}"] + lines[index + 1:], index


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize(("log", "row"), [("v0", False), ("v0", True), ("v3", False), ("v4", False)])
def test_every_reader_refuses_a_line_nested_too_deeply_by_name(log, row, depth):
    source, lines = LOGS[log]
    deep, index = _deepened(lines, depth, row)
    result = load_session_bytes(b"\n".join(deep) + b"\n", source, "none")
    assert isinstance(result.error, CorruptionError), result.error
    # v0 counts lines from the header, v3 and v4 (as dsh) event lines from 1 and rows from 0
    where = {"v0": f"line {index + 1}", "v3": f"row {index}", "v4": f"line {index}"}[log]
    assert re.search(rf"\b{where}\b", result.error.message), result.error


@pytest.mark.parametrize("log", sorted(LOGS))
def test_a_value_nested_at_the_limit_is_read(log):
    source, lines = LOGS[log]
    last = json.loads(lines[-1])
    seq = (last.get("seq0", 0) + len(last["data"].get("texts", last["data"].get("args", [])))) if "seq0" in last \
        else last["seq"] + 1
    event = {"type": "x-ext/deep", "seq": seq, "time": last.get("time", 1), "ignorable": True, "data": {}}
    line = json.dumps(event).encode()[:-2] + b'"d":' + nested(MAX_DEPTH - 2) + b"}}"
    result = load_session_bytes(b"\n".join(lines + [line]) + b"\n", source, "none")
    assert result.accepted and result.stored_count == seq + 1 and not result.dropped_bytes, result.error


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 950, 100_000])
def test_inspect_refuses_a_file_nested_too_deeply_without_a_traceback(tmp_path, depth):
    source, lines = LOGS["v0"]
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b"\n".join(_deepened(lines, depth, row=True)[0]) + b"\n")
    for flags in ((), ("--json",)):
        done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "inspect", *flags, str(path)],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert TOO_DEEP in done.stdout and "[corrupt-storage] CorruptionError" in done.stdout if not flags else \
            json.loads(done.stdout)["error"]["category"] == "corrupt-storage", done.stdout


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 950, 100_000])
@pytest.mark.parametrize("log", ["v0", "v4"])
def test_every_service_refuses_a_record_nested_too_deeply_by_name(log, depth):
    source, lines = LOGS[log]
    header = json.loads(lines[0])
    version = header.get("version", 0)
    deep = lines[1][:-1] + b',"deep":' + nested(depth - 1) + b"}"
    records = fetched([SessionRecord(header["id"], KIND_HEADER, 0, 0, lines[0], version),
                       SessionRecord(header["id"], KIND_RECORD, 0, 1, deep, version),
                       SessionRecord("deep-header", KIND_HEADER, 0, 0, lines[0][:-1] + b',"x":' + nested(depth - 1)
                                     + b"}", version)])
    with tempfile.TemporaryDirectory() as tmp:
        for policy in (Projection(ProjectorConfig(kafka=KAFKA, store=Path(tmp) / "views.sqlite")),
                       Audit(AuditorConfig(kafka=KAFKA)), Archive(ArchiverConfig(kafka=KAFKA, root=Path(tmp) / "a"))):
            outputs = run_batch(policy, records)
            letters = [(headers["dsh-dlq-reason"], headers["dsh-dlq-error"].decode())
                       for _, _, headers in outputs.on(NAMES.dead_letter)]
            findings = [(json.loads(value)["rule"], json.loads(value)["detail"]) for _, value, _ in
                        outputs.on(NAMES.findings)]
            refusals = letters if policy.name != "auditor" else findings  # the auditor reports what it cannot read
            assert len(refusals) == 2 and all(reason in (b"corrupt-storage", "corrupt-storage") and TOO_DEEP in text
                                              for reason, text in refusals), (policy.name, letters, findings)


def test_json_inside_strings_is_bounded_too():
    """Tool-call arguments are JSON text inside a string: parsed with the same limit."""
    deep = nested(5000).decode()
    body = {"model": "m", "messages": [{"role": "assistant", "content": "",
                                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep}}]}]}
    assert normalize("chat-completions", body)["messages"][0]["toolCalls"][0]["arguments"] == deep  # kept as text
    assert lossless_problem(b'{"a": 12345678901234567,"b":' + nested(5000) + b"}") is None  # the fold refuses it
    with pytest.raises(WireError, match=TOO_DEEP):
        messages_body({"config": {"model": "m"}}, None, [
            {"id": "a", "role": "assistant", "content": [{"type": "tool-call", "id": "c", "name": "f", "arguments": deep}],
             "source": {"kind": "model", "model": "m"}}])
