"""Our v0→v4 migration against dsh 0.2.1rc2's own (its reader migrates a v0
log in memory through its v0→v1→v2→v3→v4 chain): every v0 log of the
conformance corpus that the 0.1.x reference accepts, the logs dsh 0.1.0rc7,
0.1.1rc1 and 0.1.2rc1 wrote (``tests/fixtures``) and simulated v0 sessions,
side by side in one sessions root (so parents and their subagent children
meet, as dsh's catalog migration needs).
dsh's verdict and category must be ours, a refusal must give dsh's reason,
and an accepted log must migrate to exactly dsh's events, key order included,
written as the very lines dsh writes.
The same holds for those logs with one event's payload mutated
(:mod:`tests.differential.v0_mutations`), which dsh's v0 inventory checks.
"""

from __future__ import annotations

import io
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dsh_core.errors import DshError
from dsh_core.inspect import inspect_path
from dsh_core.jsonvalue import encode_json, thaw
from dsh_core.storage.framing import frame_pieces, iter_frames
from dsh_core.migration.migrate import migrated_log, v4_file
from dsh_core.formats.v4.rows import encode_seq_ranges
from tests.conftest import ROOT, corpus_logs, expected_of
from tests.differential.test_simulated_logs import _write
from tests.differential.v0_mutations import write_mutations
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


def event_lines(file: bytes) -> list[bytes]:
    """The event lines of a v4 file's bytes (after its header line)."""
    stream = io.BytesIO(file)
    text = b"".join(piece for frame in iter_frames(stream, "v4 file") for piece in frame_pieces(stream, frame, "v4 file"))
    return text.split(b"\n")[1:-1]


def dsh_lines(events: list[dict]) -> list[bytes]:
    """The lines dsh writes for its migrated events: each in its own key order,
    ``sourceEventSeqs`` range-encoded in place (its ``encodeSourceEventRanges``)."""
    return [encode_json({**event, "sourceEventSeqs": encode_seq_ranges(event["sourceEventSeqs"])}
                        if "sourceEventSeqs" in event else event) for event in events]


def _ours(path: Path):
    try:
        return migrated_log(path), None
    except DshError as error:
        return None, error


#: sessions per sessions root read by one Node process: dsh's reader slows
#: down with the number of sessions beside the one it opens (120 to a root
#: took twice the CPU of 20 for the same 1,706 mutated logs).
_SHARD = 20


@pytest.fixture(scope="module")
def mutated(oracle: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Path, dict]]:
    """Every payload mutation, as dsh's reader reads it, with what was mutated."""
    written = list(write_mutations(tmp_path_factory.mktemp("v0-mutations-all")).items())
    roots = []
    for start in range(0, len(written), _SHARD):
        root = tmp_path_factory.mktemp("v0-mutations")
        for session_id, (path, _) in written[start:start + _SHARD]:
            moved = root / path.relative_to(path.parents[2])
            moved.parent.mkdir(parents=True)
            path.rename(moved)
        roots.append(root)
    with ThreadPoolExecutor(max_workers=2) as pool:
        theirs = {key: value for shard in pool.map(run_oracle, roots) for key, value in shard.items()}
    return [(f"{session_id} ({mutation.event_type} {mutation.what})",
             next(root for root in roots if (root / path.relative_to(path.parents[2])).exists())
             / path.relative_to(path.parents[2]), theirs[session_id])
            for session_id, (path, mutation) in written]


def _disagreements(readings) -> tuple[list[tuple], int]:
    """Where our verdict, category or reason is not dsh's; and how many dsh refused."""
    disagreements, refused = [], 0
    for session_id, path, theirs in readings:
        ours, error = _ours(path)
        if theirs["ok"] != (error is None):
            disagreements.append((session_id, error and error.message, theirs.get("message")))
        elif error is not None:
            refused += 1
            if error.category != theirs["category"] or _reason(theirs) not in error.message:
                disagreements.append((session_id, error.message, theirs["message"]))
    return disagreements, refused


def _reason(theirs: dict) -> str:
    return theirs["message"].split("; source v0 artifact remains unchanged")[0].split("refuses this format v0 "
                                                                                      "Session: ")[-1]


def test_dsh_s_verdict_category_and_reason_are_ours(readings):
    disagreements, refused = _disagreements(readings)
    assert disagreements == [], "\n".join(map(str, disagreements))
    assert refused >= 25 and len(readings) - refused >= 85


_MEMBER_SET = re.compile(r"^\S+ \d+ data (?:has unexpected|lacks required) member ")


def test_payload_mutations_get_dsh_s_verdict_category_and_reason(mutated):
    """dsh's migration chain refuses most mutations (its v0 inventory most
    of those), each with the text of the check that failed first; we refuse
    the same ones, alike."""
    disagreements, refused = _disagreements(mutated)
    assert disagreements == [], f"{len(disagreements)} of {len(mutated)}:\n" + "\n".join(map(str, disagreements))
    nested = [theirs for _, _, theirs in mutated if not theirs["ok"] and "refuses this format v0 Session: " in
              theirs["message"] and not _MEMBER_SET.match(_reason(theirs))]
    accepted = len(mutated) - refused
    assert len(mutated) >= 1700 and refused >= 1350 and accepted >= 300 and len(nested) >= 1100, \
        (len(mutated), refused, len(nested))


def test_accepted_mutations_migrate_to_exactly_dsh_s_events(mutated):
    compared = 0
    for session_id, path, theirs in mutated:
        if theirs["ok"]:
            assert [thaw(event) for event in migrated_log(path).events] == theirs["events"], session_id
            compared += 1
    assert compared >= 100


def test_accepted_logs_migrate_to_exactly_dsh_s_events(readings):
    compared = 0
    for session_id, path, theirs in readings:
        if not theirs["ok"]:
            continue
        ours, _ = _ours(path)
        events = [thaw(event) for event in ours.events]
        assert events == theirs["events"], session_id
        assert [list(event) for event in events] == [list(event) for event in theirs["events"]], session_id
        assert event_lines(v4_file(ours)) == dsh_lines(theirs["events"]), session_id
        assert ours.header.to_dict() | {"version": 4} == theirs["header"], session_id
        compared += 1
    assert compared >= 85


def test_every_v0_release_s_own_logs_are_migrated(readings):
    """A log a released dsh wrote is one its successor must open: dsh 0.2.1
    accepts each (and the test above holds ours to its events)."""
    ids = {inspect_path(log).to_json()["sessionHeader"]["id"] for log in _release_logs()}
    verdicts = {session_id: theirs["ok"] for session_id, _, theirs in readings if session_id in ids}
    assert len(verdicts) == len(ids) >= 21 and all(verdicts.values()), verdicts
