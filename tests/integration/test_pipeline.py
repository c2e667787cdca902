"""Simulator → projector + auditor on the real broker, a fleet of v0, v3 and v4
sessions: views and findings equal the ground truth exactly."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from dsh_core.loader import load_session, read_events
from dsh_core.storage.layout import find_session_files
from producers.simulator import messages_digest
from consumers.projector import ViewStore
from producers.simulator import FaultPlan, SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet, run_until
from tests.services import archiver, auditor, projector
from tests.kafka_fixtures import caught_up, consume_all, end_offsets

pytestmark = pytest.mark.kafka

EXPECTED_RULE = {"unlogged": "request-mismatch", "dropped": "sequence-gap", "lossless": "lossless",
                 "unknown": "unsupported-format"}


def expected_findings(truths) -> collections.Counter:
    return collections.Counter((t.session_id, EXPECTED_RULE[d.kind], d.seq) for t in truths for d in t.defects
                               if d.kind in EXPECTED_RULE)


def check_views(db, truths) -> list[str]:
    """Sessions whose view differs from the ground truth (empty when all match)."""
    store = ViewStore(db)
    wrong = []
    try:
        for truth in truths:
            view = store.view(truth.session_id)
            kinds = {d.kind for d in truth.defects}
            if view is None:
                wrong.append(truth.session_id)
            elif "dropped" in kinds:
                gap = next(d.seq for d in truth.defects if d.kind == "dropped")
                if view["status"] != "held" or view["heldFrom"] != gap:
                    wrong.append(truth.session_id)
            elif "unknown" in kinds:
                if view["status"] != "refused" or "unsupported-format" not in view.get("error", ""):
                    wrong.append(truth.session_id)
            elif view["nextSeq"] != truth.next_seq or view["messagesDigest"] != truth.messages_digest:
                wrong.append(truth.session_id)
    finally:
        store.close()
    return wrong


def test_findings_equal_injected_defects(kafka, topics, group_id, tmp_path):
    names = topics(partitions=12)
    faults = FaultPlan(unlogged=6, dropped=4, duplicate=4, lossless=4, unknown=3)
    config = SimulatorConfig(sessions=300, seed=33, max_turns=4, faults=faults, formats=(0, 3, 4))
    truths = asyncio.run(publish_fleet(kafka, names, config))
    expected = expected_findings(truths)
    assert sum(expected.values()) == faults.total - faults.duplicate
    db = tmp_path / "views.sqlite"

    async def consume() -> list:
        ends = await end_offsets(kafka, names.events)
        projecting = projector(kafka, names, group_id("projector"), db)
        # a small LRU and a store checkpoint every batch: sessions go cold
        # and come back from the auditor's state store
        auditing = auditor(kafka, names, group_id("auditor"), state=tmp_path / "auditor.sqlite", hot_sessions=40,
                           checkpoint_seconds=0)
        archiving = archiver(kafka, names, group_id("archiver"), tmp_path / "archive")
        await asyncio.gather(run_until(projecting, lambda: caught_up(projecting, ends)),
                             run_until(auditing, lambda: caught_up(auditing, ends)),
                             run_until(archiving, lambda: caught_up(archiving, ends)))
        assert check_views(db, truths) == []
        # everything the auditor committed, and a little longer for any extra
        return await consume_all(kafka, names.findings, sum(expected.values()), timeout=10, settle=1.5,
                                 committed_only=True)

    records = asyncio.run(consume())
    # the archive holds every shipped record: clean sessions load as the truth
    archived = {path.parent.name: path for path in find_session_files(tmp_path / "archive")}
    assert len(archived) == len(truths)
    for truth in truths:
        kinds = {d.kind for d in truth.defects}
        result = load_session(archived[truth.session_id])
        if "dropped" in kinds:
            gap = next(d.seq for d in truth.defects if d.kind == "dropped")
            assert len(read_events(archived[truth.session_id])[1]) == gap
        elif "unknown" in kinds:
            assert result.error is not None and result.error.category == "unsupported-format"
        else:
            assert result.accepted, (truth.session_id, result.error)
            assert result.stored_count == truth.next_seq
            assert messages_digest(result.state.messages()) == truth.messages_digest
    findings = [json.loads(r.value) for r in records]
    got = collections.Counter((f["session"], f["rule"], f["seq"]) for f in findings)
    assert got == expected, f"extra: {got - expected}, missing: {expected - got}"
