"""Conformance with every published dsh runtime release: real logs each
release wrote (``tests/fixtures/dsh-<release>``), each read as an oracle
reads it (``NAME.expected.json``): our reader accepts every one and derives
what the oracle derives.

| folder | written by | format | oracle in ``NAME.expected.json`` |
|---|---|---|---|
| ``dsh-0.1.0`` | 0.1.0rc7's JSON-RPC agent | v0 | the v0 reference (npm ``@deepseek-ai/dsh-session`` 0.1.1-rc.2), and under ``dsh-0.2.1`` dsh 0.2.1rc2's migration |
| ``dsh-0.1.1`` | 0.1.1rc1's JSON-RPC agent | v0 | the same two |
| ``dsh-0.1.2`` | 0.1.2rc1's CLI | v0, ranges | dsh 0.1.2's own reader |
| ``dsh-0.1.5`` | 0.1.5rc1's CLI | v3 | dsh 0.2.1rc2's reader (``python -m tests.oracle.expectations``) |
| ``dsh-0.2.1`` | 0.2.1rc2's CLI | v4 | the same |

The v0 folders of 0.1.0 and 0.1.1 come from ``tests/fixtures/generate_jsonrpc.py``;
``tests/differential/test_v0_migration.py`` also runs dsh 0.2.1's migration
of every v0 folder live."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.jsonvalue import thaw
from dsh_core.migration.migrate import migrate, migrated_log
from dsh_core.formats.v4.wire import messages_body
from tests.conftest import canonical
from tests.oracle import place_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RELEASES = ("dsh-0.1.0", "dsh-0.1.1", "dsh-0.1.2", "dsh-0.1.5", "dsh-0.2.1")
LOGS = sorted(log for release in RELEASES for log in (FIXTURES / release).glob("*.jsonl.zstd"))
READING = ("derivedMessages", "surfaceNodes", "requestHeader", "requestContext")  # every oracle gives these
COUNTS = ("eventCount", "replaceGeneration")  # all but dsh 0.1.2's reading give these too


def _name(log: Path) -> str:
    return log.name.split(".")[0]


def _version(log: Path) -> int:
    """The format a file name declares: ``NAME.vN.jsonl.zstd``, or v0."""
    match = re.search(r"\.v([0-9]+)\.jsonl\.zstd$", log.name)
    return int(match.group(1)) if match else 0


def _expected(log: Path) -> dict:
    return json.loads(log.with_name(_name(log) + ".expected.json").read_text("utf-8"))


def test_every_published_release_has_its_logs():
    logs = {release: [log for log in LOGS if log.parent.name == release] for release in RELEASES}
    assert {release: len(found) >= 7 for release, found in logs.items()} == dict.fromkeys(RELEASES, True)
    for release in ("dsh-0.1.0", "dsh-0.1.1"):  # a compaction and a retry in each
        assert {"compact", "retry", "parallel", "two-turns"} <= {_name(log) for log in logs[release]}


@pytest.mark.parametrize("log", LOGS, ids=lambda log: f"{log.parent.name}/{_name(log)}")
def test_what_the_oracle_derives_from_a_release_s_own_log(log):
    expected, ours = _expected(log), inspect_path(log).to_json()
    assert ours["accepted"] == expected.get("accepted", True), ours["error"]
    if not ours["accepted"]:
        assert ours["error"]["category"] == expected["category"]
        return
    assert set(READING) <= set(expected)
    for key in (*READING, *COUNTS):
        if key in expected:
            assert canonical(ours[key]) == canonical(expected[key]), key
    assert ours["sessionHeader"]["version"] == _version(log)


V0_MIGRATED = [log for log in LOGS if "dsh-0.2.1" in _expected(log)]


@pytest.mark.parametrize("log", V0_MIGRATED, ids=lambda log: f"{log.parent.name}/{_name(log)}")
def test_our_v0_migration_is_dsh_0_2_1_s(log, tmp_path):
    """What dsh 0.2.1rc2's reader made of the v0 log (its in-memory v0→v4
    migration, kept in ``expected["dsh-0.2.1"]``): the same verdict, header
    and events (a digest of them, key order included), and the migrated log
    derives the same surface and messages."""
    theirs = _expected(log)["dsh-0.2.1"]
    place_log(log, tmp_path)
    [placed] = tmp_path.glob("*/*/session.jsonl.zstd")
    assert theirs["accepted"], theirs
    ours = migrated_log(placed)
    events = [thaw(event) for event in ours.events]
    assert len(events) == theirs["eventCount"]
    assert ours.header.to_dict() | {"version": 4} == theirs["header"]
    assert hashlib.sha256(_compact(events)).hexdigest() == theirs["eventsSha256"]
    reading = inspect_path(migrate(placed)).to_json()
    assert reading["accepted"], reading["error"]
    assert reading["surfaceNodes"] == theirs["surfaceNodes"]
    assert canonical(reading["derivedMessages"]) == canonical(theirs["derivedMessages"])


def _compact(value: object) -> bytes:
    """The digest's form (``generate_jsonrpc.events_digest``): compact JSON, key order kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


V4_LOGS = [log for log in LOGS if log.parent.name == "dsh-0.2.1"]


@pytest.mark.parametrize("log", V4_LOGS, ids=_name)
def test_every_agent_request_dsh_sent_is_rebuilt_from_the_log_prefix(log):
    """The bodies the 0.2.1rc2 runtime POSTed to ``/v1/messages`` (less
    ``dsh_session_log`` and ``dsh_plugin_packages``), in order, against the
    Messages body rebuilt in front of each ``assistant/message`` and
    ``assistant/attempt``; title and compaction requests are not agent steps."""
    sent = [request for request in json.loads(log.with_name(_name(log) + ".requests.json").read_text())
            if request["kind"] == "agent"]
    rebuilt = [messages_body(request["header"], request["context"], request["messages"])
               for request in inspect_path(log).to_json()["requests"]]
    assert len(rebuilt) == len(sent) >= 1
    for number, (body, request) in enumerate(zip(rebuilt, sent), start=1):
        assert canonical(body) == canonical(request["body"]), f"request {number} (HTTP {request['status']})"
