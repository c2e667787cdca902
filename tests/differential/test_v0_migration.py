"""Our v0→v4 migration against dsh 0.2.1rc2's own (its reader migrates a v0
log in memory through its v0→v1→v2→v3→v4 chain): every v0 log of the
conformance corpus that the 0.1.x reference accepts, the logs dsh 0.1.0rc7,
0.1.1rc1 and 0.1.2rc1 wrote (``tests/fixtures``) and simulated v0 sessions,
side by side in one sessions root (so parents and their subagent children
meet, as dsh's catalog migration needs).
dsh's verdict and category must be ours, a refusal must give dsh's reason,
and an accepted log must migrate to exactly dsh's events, key order included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_core.errors import DshError
from dsh_core.inspect import inspect_path
from dsh_core.jsonvalue import thaw
from dsh_core.v4.migrate import migrated_log
from tests.conftest import ROOT, corpus_logs, expected_of
from tests.differential.test_simulated_logs import _write
from tests.layout_helpers import place
from tests.oracle import place_log, run_oracle


V0_RELEASES = ("dsh-0.1.0", "dsh-0.1.1", "dsh-0.1.2")  # the fixture folders of the releases that write v0


def _release_logs() -> list[Path]:
    folders = [ROOT / "tests" / "fixtures" / release for release in V0_RELEASES]
    return sorted(log for folder in folders for log in folder.glob("*.jsonl.zstd"))


@pytest.fixture(scope="module")
def readings(oracle: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Path, dict]]:
    root = tmp_path_factory.mktemp("v0-sessions")
    paths: dict[str, Path] = {}
    for log in corpus_logs("dsh-real"):
        want = expected_of(log)
        if want["accepted"] and want["sessionHeader"]["id"] not in paths:
            paths[want["sessionHeader"]["id"]] = place(root, log.read_bytes(), "zstd")
    for log in _release_logs():
        session_id = place_log(log, root)
        paths[session_id] = next(root.glob(f"*/{session_id}/session.jsonl.zstd"))
    paths |= {session_id: path for session_id, (path, _) in _write(root, 0).items()}
    theirs = run_oracle(root)
    return [(session_id, path, theirs[session_id]) for session_id, path in sorted(paths.items())]


def _ours(path: Path):
    try:
        return migrated_log(path), None
    except DshError as error:
        return None, error


def test_dsh_s_verdict_category_and_reason_are_ours(readings):
    disagreements, refused = [], 0
    for session_id, path, theirs in readings:
        ours, error = _ours(path)
        if theirs["ok"] != (error is None):
            disagreements.append((session_id, error and error.message, theirs.get("message")))
        elif error is not None:
            refused += 1
            reason = theirs["message"].split("; source v0 artifact remains unchanged")[0].split("refuses this format v0 "
                                                                                           "Session: ")[-1]
            if error.category != theirs["category"] or reason not in error.message:
                disagreements.append((session_id, error.message, theirs["message"]))
    assert disagreements == [], "\n".join(map(str, disagreements))
    assert refused >= 25 and len(readings) - refused >= 85


def test_accepted_logs_migrate_to_exactly_dsh_s_events(readings):
    compared = 0
    for session_id, path, theirs in readings:
        if not theirs["ok"]:
            continue
        ours, _ = _ours(path)
        events = [thaw(event) for event in ours.events]
        assert events == theirs["events"], session_id
        assert [list(event) for event in events] == [list(event) for event in theirs["events"]], session_id
        assert ours.header.to_dict() | {"version": 4} == theirs["header"], session_id
        compared += 1
    assert compared >= 85


def test_every_v0_release_s_own_logs_are_migrated(readings):
    """A log a released dsh wrote is one its successor must open: dsh 0.2.1
    accepts each (and the test above holds ours to its events)."""
    ids = {inspect_path(log).to_json()["sessionHeader"]["id"] for log in _release_logs()}
    verdicts = {session_id: theirs["ok"] for session_id, _, theirs in readings if session_id in ids}
    assert len(verdicts) == len(ids) >= 21 and all(verdicts.values()), verdicts
