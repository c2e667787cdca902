"""Each session's audit verdict counts: published by the auditor in the
transaction of the batch that changed them, cumulative, kept across its
state store, and indexed into the view store."""

from __future__ import annotations

import json

from consumers.auditor import Audit, AuditorConfig
from consumers.auditor.session import AuditedSession
from consumers.projector import ViewStore
from consumers.projector.outcomes import verdict_row
from consumers.projector.store_reader import StoreReader
from dsh_kafka.records import KIND_ATTESTATION
from producers.simulator import SimulatorConfig, simulate_session
from tests.policy_driver import KAFKA, NAMES, Fetched, fetched, run_batch


def _session(faults: list[str] | None = None):
    config = SimulatorConfig(sessions=1, seed=61, min_turns=3, max_turns=3)
    truth, batches = simulate_session(config, 0, faults)
    return truth, [record for batch in batches for record in batch]


def _published(outputs) -> list[tuple[bytes, dict]]:
    return [(key, json.loads(value)) for key, value, _ in outputs.on(NAMES.verdicts)]


def test_counts_are_cumulative_and_published_once_per_batch_that_changed_them():
    truth, records = _session()
    attestations = sum(1 for record in records if record.kind == KIND_ATTESTATION)
    half = next(index for index, record in enumerate(records) if record.kind == KIND_ATTESTATION) + 1
    policy = Audit(AuditorConfig(kafka=KAFKA))
    first = _published(run_batch(policy, fetched(records[:half])))
    second = _published(run_batch(policy, fetched(records[half:])))
    key = truth.session_id.encode()
    assert first == [(key, {"session": truth.session_id, "attested": {"verified": 1}, "wire": {}})]
    assert second == [(key, {"session": truth.session_id, "attested": {"verified": attestations}, "wire": {}})]
    assert attestations > 1
    assert _published(run_batch(policy, fetched(records[-1:]))) == []  # a duplicate: no verdict, nothing sent


def test_a_mismatch_is_counted_beside_the_verified_ones():
    truth, records = _session(["unlogged"])
    counts = _published(run_batch(Audit(AuditorConfig(kafka=KAFKA)), fetched(records)))[-1][1]["attested"]
    assert counts["mismatch"] == 1 and counts["verified"] == sum(
        1 for record in records if record.kind == KIND_ATTESTATION) - 1


def test_the_state_store_keeps_the_counts():
    truth, records = _session()
    policy = Audit(AuditorConfig(kafka=KAFKA))
    run_batch(policy, fetched(records))
    session = policy.sessions.get(truth.session_id)
    restored = AuditedSession.restore(truth.session_id, session.snapshot(), lambda seq: None)
    assert restored.report.totals == session.report.totals and restored.report.totals["attested/verified"] > 1
    assert not restored.report.totals_changed


def test_the_index_keeps_each_session_s_latest_counts(tmp_path):
    def record(offset: int, value: bytes) -> Fetched:
        return Fetched(b"s-1", value, [], offset, topic=NAMES.verdicts)

    rows = [verdict_row(record(offset, json.dumps(
        {"session": "s-1", "attested": {"verified": offset}, "wire": {"agent": {"verified": 1}}}).encode()))
        for offset in (4, 9)]
    assert verdict_row(record(10, b'{"session": "s-1"}')) is None and verdict_row(record(11, b"\xff")) is None
    store = ViewStore(tmp_path / "views.sqlite")
    try:
        store.index_outcomes([], [], rows[:1], {(NAMES.verdicts, 0): 5})
        store.index_outcomes([], [], rows[1:], {(NAMES.verdicts, 0): 10})
        assert [tuple(row) for row in store.db.execute("SELECT session_id, counts, \"offset\" FROM audit_verdicts")] == [
            ("s-1", '{"attested":{"verified":9},"wire":{"agent":{"verified":1}}}', 9)]
        store.delete_session("s-1", 1700000000000)
        assert store.db.execute("SELECT count(*) FROM audit_verdicts").fetchone()[0] == 0
    finally:
        store.close()
    assert StoreReader(tmp_path / "views.sqlite").session("s-1") is None
