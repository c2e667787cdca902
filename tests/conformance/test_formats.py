"""Conformance of every published format after v0: real logs each dsh
release wrote (``tests/fixtures/dsh-<release>``), read as dsh 0.2.1rc2's own
reader reads them (``NAME.expected.json``, made by
``python -m tests.oracle.expectations``): the same verdict, event count,
surface, derived messages, request header and request context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.v4.wire import messages_body
from tests.conftest import canonical

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = sorted([*FIXTURES.glob("dsh-0.1.5/*.v3.jsonl.zstd"), *FIXTURES.glob("dsh-0.2.1/*.v4.jsonl.zstd")])


def _expected(log: Path) -> dict:
    return json.loads(log.with_name(log.name.split(".v")[0] + ".expected.json").read_text("utf-8"))


def test_every_release_after_v0_has_its_logs():
    releases = {log.parent.name for log in LOGS}
    assert releases == {"dsh-0.1.5", "dsh-0.2.1"}
    assert all(sum(log.parent.name == release for log in LOGS) >= 8 for release in releases)


@pytest.mark.parametrize("log", LOGS, ids=lambda log: f"{log.parent.name}/{log.name.split('.v')[0]}")
def test_what_dsh_derives_from_its_own_logs(log):
    expected, ours = _expected(log), inspect_path(log).to_json()
    assert ours["accepted"] == expected["accepted"], ours["error"]
    if not expected["accepted"]:
        assert ours["error"]["category"] == expected["category"]
        return
    for key in ("eventCount", "surfaceNodes", "replaceGeneration", "derivedMessages", "requestHeader",
                "requestContext"):
        assert canonical(ours[key]) == canonical(expected[key]), key
    assert ours["sessionHeader"]["version"] == int(log.name.split(".v")[1].split(".")[0])


V4_LOGS = [log for log in LOGS if log.parent.name == "dsh-0.2.1"]


@pytest.mark.parametrize("log", V4_LOGS, ids=lambda log: log.name.split(".v")[0])
def test_every_agent_request_dsh_sent_is_rebuilt_from_the_log_prefix(log):
    """The bodies the 0.2.1rc2 runtime POSTed to ``/v1/messages`` (less
    ``dsh_session_log`` and ``dsh_plugin_packages``), in order, against the
    Messages body rebuilt in front of each ``assistant/message`` and
    ``assistant/attempt``; title and compaction requests are not agent steps."""
    sent = [request for request in json.loads(log.with_name(log.name.split(".v")[0] + ".requests.json").read_text())
            if request["kind"] == "agent"]
    rebuilt = [messages_body(request["header"], request["context"], request["messages"])
               for request in inspect_path(log).to_json()["requests"]]
    assert len(rebuilt) == len(sent) >= 1
    for number, (body, request) in enumerate(zip(rebuilt, sent), start=1):
        assert canonical(body) == canonical(request["body"]), f"request {number} (HTTP {request['status']})"
