"""The demo's ground-truth comparison, offline: a tiny simulated fleet, its
manifest, an archive written in dsh's layout and views given as dicts.

``compare`` itself only adds opening the projector's view store and listing
the archive; the demo's integration test runs it against a real one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dsh_core.storage.layout import find_session_files
from dsh_kafka.records import KIND_HEADER, KIND_RECORD
from dsh_pipeline.ground_truth import EXPECTED_RULE, compare_findings, compare_sessions
from producers.fleet import manifest
from producers.simulator import SimulatorConfig, simulate_session
from tests.layout_helpers import place

CONFIG = SimulatorConfig(sessions=3, seed=11, max_turns=2, big_result_probability=0.0)
FAULTS = {0: [], 1: ["dropped"], 2: ["unknown"]}  # a clean session, one with a gap, one refused


class Fleet:
    """The manifest, the archive root and the views of :data:`FAULTS`'s sessions."""

    def __init__(self, root: Path) -> None:
        truths, self.logs = [], {}
        for index, faults in FAULTS.items():
            truth, batches = simulate_session(CONFIG, index, list(faults))
            records = [r for batch in batches for r in batch if r.kind in (KIND_HEADER, KIND_RECORD)]
            truths.append(truth)
            self.logs[truth.session_id] = records
        self.manifest = manifest(CONFIG, truths)
        self.truths = self.manifest["truth"]
        self.clean, self.gapped, self.refused = (t.session_id for t in truths)
        assert [d["kind"] for d in self.truths[self.gapped]["defects"]] == ["dropped"], "the fixture lost its gap"
        assert [d["kind"] for d in self.truths[self.refused]["defects"]] == ["unknown"]
        self.root = root
        for session_id in self.logs:
            self.archive(session_id)
        self.views: dict[str, dict[str, Any] | None] = {
            self.clean: {"status": "open", "nextSeq": self.truths[self.clean]["next_seq"],
                         "messagesDigest": self.truths[self.clean]["messages_digest"]},
            self.gapped: {"status": "held", "heldFrom": self.gap, "nextSeq": self.gap},
            self.refused: {"status": "refused", "nextSeq": self.truths[self.refused]["defects"][0]["seq"]}}

    @property
    def gap(self) -> int:
        return self.truths[self.gapped]["defects"][0]["seq"]

    def archive(self, session_id: str, drop_last: int = 0, past_gap: bool = False) -> None:
        """Write the session as the archiver would: the shipped records up to a
        gap (or past it), in zstd framing; replaces an earlier file."""
        records = self.logs[session_id]
        if session_id == self.gapped and not past_gap:
            records = [r for r in records if r.seq < self.gap or r.kind == KIND_HEADER]
        records = records[:len(records) - drop_last]
        for old in self.root.glob(f"*/{session_id}/*"):
            old.unlink()
        place(self.root, b"".join(r.value + b"\n" for r in records), "zstd")

    def problems(self) -> list[str]:
        archived = {p.parent.name: p for p in find_session_files(self.root)}
        return compare_sessions(self.truths, self.views.get, archived)


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path / "archive")


def test_a_faithful_pipeline_agrees(fleet: Fleet) -> None:
    assert fleet.problems() == []


def test_a_view_with_other_messages_differs(fleet: Fleet) -> None:
    fleet.views[fleet.clean] = {**fleet.views[fleet.clean], "messagesDigest": "0" * 64}
    assert fleet.problems() == [f"{fleet.clean}: view differs from ground truth"]


def test_a_view_short_of_the_last_seq_differs(fleet: Fleet) -> None:
    fleet.views[fleet.clean] = {**fleet.views[fleet.clean], "nextSeq": fleet.truths[fleet.clean]["next_seq"] - 1}
    assert fleet.problems() == [f"{fleet.clean}: view differs from ground truth"]


def test_missing_views_and_archives_are_named(fleet: Fleet) -> None:
    fleet.views[fleet.clean] = None
    for path in fleet.root.glob(f"*/{fleet.refused}/*"):
        path.unlink()
    assert fleet.problems() == [f"{fleet.clean}: missing view", f"{fleet.refused}: missing archive"]


def test_an_archive_short_of_the_shipped_log_differs(fleet: Fleet) -> None:
    fleet.archive(fleet.clean, drop_last=1)
    assert fleet.problems() == [f"{fleet.clean}: archive differs from the shipped log"]


def test_a_gap_must_hold_the_view_and_stop_the_archive(fleet: Fleet) -> None:
    fleet.views[fleet.gapped] = {"status": "open", "nextSeq": fleet.truths[fleet.gapped]["next_seq"]}
    fleet.archive(fleet.gapped, past_gap=True)
    assert fleet.problems() == [f"{fleet.gapped}: expected a view held at seq {fleet.gap}, got open",
                                f"{fleet.gapped}: archive should stop at the gap (seq {fleet.gap})"]


def test_a_view_held_elsewhere_than_the_gap_differs(fleet: Fleet) -> None:
    fleet.views[fleet.gapped] = {"status": "held", "heldFrom": fleet.gap + 1}
    assert fleet.problems() == [f"{fleet.gapped}: expected a view held at seq {fleet.gap}, got held"]


def test_an_unknown_required_event_must_refuse_the_view(fleet: Fleet) -> None:
    fleet.views[fleet.refused] = {"status": "open"}
    assert fleet.problems() == [f"{fleet.refused}: expected a refused view, got open"]


# ----------------------------------------------------------------- findings

TRUTHS = {
    "s-a": {"defects": [{"kind": "unlogged", "seq": 7}, {"kind": "duplicate", "seq": 9}]},
    "s-b": {"defects": [{"kind": "dropped", "seq": 3}]},
    "s-c": {"defects": [{"kind": "lossless", "seq": 5}, {"kind": "unknown", "seq": 12}]},
    "s-d": {"defects": []},
}
FOUND = [{"session": "s-a", "rule": "request-mismatch", "seq": 7, "detail": "extra message"},
         {"session": "s-b", "rule": "sequence-gap", "seq": 3},
         {"session": "s-c", "rule": "lossless", "seq": 5},
         {"session": "s-c", "rule": "unsupported-format", "seq": 12}]


def test_every_expected_finding_and_no_other_agrees() -> None:
    assert compare_findings(TRUTHS, FOUND) == []
    assert compare_findings(TRUTHS, reversed(FOUND)) == []  # order does not matter


def test_a_missed_finding_is_named() -> None:
    assert compare_findings(TRUTHS, FOUND[1:]) == ["missed finding ('s-a', 'request-mismatch', 7)"]


def test_extra_and_repeated_findings_are_unexpected() -> None:
    found = FOUND + [FOUND[1], {"session": "s-d", "rule": "lossless", "seq": 1}]
    assert compare_findings(TRUTHS, found) == ["unexpected finding ('s-b', 'sequence-gap', 3)",
                                               "unexpected finding ('s-d', 'lossless', 1)"]


def test_a_finding_at_another_seq_or_rule_is_both_missed_and_unexpected() -> None:
    found = copy.deepcopy(FOUND)
    found[1]["seq"] = 4
    found[2]["rule"] = "sequence-gap"
    assert compare_findings(TRUTHS, found) == [
        "missed finding ('s-b', 'sequence-gap', 3)", "missed finding ('s-c', 'lossless', 5)",
        "unexpected finding ('s-b', 'sequence-gap', 4)", "unexpected finding ('s-c', 'sequence-gap', 5)"]


def test_a_duplicate_is_no_finding() -> None:
    assert "duplicate" not in EXPECTED_RULE
    found = FOUND + [{"session": "s-a", "rule": "sequence-gap", "seq": 9}]
    assert compare_findings(TRUTHS, found) == ["unexpected finding ('s-a', 'sequence-gap', 9)"]
