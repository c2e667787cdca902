"""Every corpus log reproduces the reference's expected.json (corpus README)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.jsonvalue import encode_json
from tests.conftest import canonical, corpus_logs, expected_of

LOGS = corpus_logs("dsh-real", "dsh-negative")
COMPARED = ("sessionHeader", "eventCount", "surfaceNodes", "replaceGeneration", "derivedMessages",
            "requestHeader", "requestContext", "turns", "requests")


def _ours(log: Path) -> dict:
    return json.loads(encode_json(inspect_path(log).to_json()))


def assert_conforms(got: dict, expected: dict, name: str) -> None:
    assert got["accepted"] == expected["accepted"], (name, got["error"], expected["error"])
    if not expected["accepted"]:
        assert got["error"]["category"] == expected["error"]["category"], (name, got["error"], expected["error"])
        assert got["error"]["name"] and got["error"]["message"]
        return
    for key in COMPARED:
        assert canonical(got[key]) == canonical(expected[key]), (name, key)
    assert (got["repair"] is None) == (expected["repair"] is None), name
    if expected["repair"] is not None:
        for key in ("droppedBytes", "closerCount", "closers", "droppedText", "repairedLog"):
            assert canonical(got["repair"][key]) == canonical(expected["repair"][key]), (name, key)


@pytest.mark.parametrize("log", LOGS, ids=[log.name for log in LOGS])
def test_log_reproduces_expected(log: Path) -> None:
    assert_conforms(_ours(log), expected_of(log), log.name)


def test_corpus_counts_match_readme() -> None:
    real = [log for log in LOGS if log.parent.name == "dsh-real"]
    negative = [log for log in LOGS if log.parent.name == "dsh-negative"]
    assert len(real) == 124 and len(negative) == 57


def test_cli_json_lines_in_input_order(tmp_path: Path) -> None:
    picked = [LOGS[0], LOGS[-1], LOGS[1]]
    run = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "inspect", "--json", *map(str, picked)],
                         capture_output=True, check=False)
    lines = run.stdout.decode().splitlines()
    assert len(lines) == 3
    for line, log in zip(lines, picked):
        assert_conforms(json.loads(line), expected_of(log), log.name)
    refused = any(not expected_of(log)["accepted"] for log in picked)
    assert run.returncode == (1 if refused else 0)
    assert b"Traceback" not in run.stderr
