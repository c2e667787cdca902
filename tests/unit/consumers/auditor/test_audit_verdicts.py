"""Each session's audit verdict counts: published by the auditor in the
transaction of the batch that changed them, cumulative, kept across its
state store (their index into the view store is a part of the store's
contract: tests/view_store_contract.py)."""

from __future__ import annotations

import json

from consumers.auditor import Audit, AuditorConfig
from consumers.auditor.session import AuditedSession
from dsh_kafka.records import KIND_ATTESTATION
from producers.simulator import SimulatorConfig, simulate_session
from tests.policy_driver import KAFKA, NAMES, fetched, run_batch


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
