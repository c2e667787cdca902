"""The auditor's state store: a restart resumes from committed state instead
of replaying the partitions, and a member without the store replays them
without repeating a finding."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from consumers.auditor import AuditStore
from consumers.runtime import ConsumerService
from producers.simulator import FaultPlan, SimulatorConfig
from tests.integration.handover import hand_over
from tests.integration.test_pipeline import expected_findings
from tests.integration.consumers.projector.test_projector import publish_fleet, run_until
from tests.kafka_fixtures import caught_up, consume_all, end_offsets, group_lag
from tests.services import auditor
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


def _findings(kafka, names, expected: collections.Counter) -> collections.Counter:
    records = asyncio.run(consume_all(kafka, names.findings, sum(expected.values()), timeout=30, settle=1.5,
                                      committed_only=True))
    return collections.Counter((f["session"], f["rule"], f["seq"]) for f in (json.loads(r.value) for r in records))


def verified() -> float:
    return REGISTRY.get_sample_value("dsh_audit_requests_total", {"verdict": "verified"}) or 0


def test_restart_resumes_from_the_state_store(kafka, topics, group_id, tmp_path):
    names = topics(partitions=4)
    group = group_id("auditor")
    faults = FaultPlan(unlogged=2, dropped=2, lossless=1, unknown=1)
    first = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=60, seed=51, max_turns=4, faults=faults)))
    state = tmp_path / "auditor.sqlite"

    def member(path) -> ConsumerService:
        return auditor(kafka, names, group, state=path, hot_sessions=25)

    async def catch_up(service: ConsumerService) -> None:
        ends = await end_offsets(kafka, names.events)
        await run_until(service, lambda: caught_up(service, ends))

    before = member(state)
    asyncio.run(catch_up(before))  # a clean stop stores every session with its partition's offset
    assert before.policy.replayed == 0
    ends = asyncio.run(end_offsets(kafka, names.events))
    store = AuditStore(state, group, names.events)
    try:
        assert {p: store.stored_offset(p) for p in ends} == ends
    finally:
        store.close()

    # more traffic: new sessions, and the stored ones continue in memory
    second = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=40, seed=52, max_turns=4,
                                                                     faults=FaultPlan(unlogged=1, dropped=1))))
    resumed = member(state)
    asyncio.run(catch_up(resumed))
    assert resumed.policy.replayed == 0

    # a member on another host, without the store, rebuilds by replaying
    # every committed record with findings muted, then goes on
    committed = sum(asyncio.run(end_offsets(kafka, names.events)).values())
    third = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=10, seed=53, max_turns=3,
                                                                    faults=FaultPlan(unlogged=1))))
    elsewhere = member(tmp_path / "elsewhere.sqlite")
    verified_before = verified()
    asyncio.run(catch_up(elsewhere))
    assert elsewhere.policy.replayed == committed
    # the replay's verdicts are not counted again: only the new requests are
    assert verified() - verified_before == sum(t.attestations for t in third) - 1  # one unlogged

    expected = expected_findings(first) + expected_findings(second) + expected_findings(third)
    got = _findings(kafka, names, expected)
    assert got == expected, f"extra: {got - expected}, missing: {expected - got}"


def test_rebalance_two_auditors_one_stopped_midway(kafka, topics, group_id, tmp_path):
    names = topics(partitions=6)
    faults = FaultPlan(unlogged=3, dropped=2, lossless=2, unknown=1)
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=150, seed=61, max_turns=4,
                                                                     faults=faults, formats=(0, 3, 4))))
    group = group_id("auditor")
    prefix = names.events[: -len("dsh.session-events")]
    total = asyncio.run(group_lag(kafka, names.events, group))

    def member() -> subprocess.Popen:
        # both on one host: they share the state store, as partitions move
        return subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "audit", "--state",
                                 str(tmp_path / "auditor.sqlite"), "--group", group,
                                 "--max-records", "300", "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix,
                                 "--partitions", "6"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    with member() as first, member() as second:
        wait_for(lambda: asyncio.run(group_lag(kafka, names.events, group)) < total * 0.7, 120, "progress")
        first.send_signal(signal.SIGTERM)  # one member leaves mid-run: its partitions move
        assert first.wait(60) == 0
        wait_for(lambda: asyncio.run(group_lag(kafka, names.events, group)) == 0, 120, "the group to finish")
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
    expected = expected_findings(truths)
    got = _findings(kafka, names, expected)
    assert got == expected, f"extra: {got - expected}, missing: {expected - got}"


def test_partitions_come_back_after_another_member_moved_their_sessions_on(kafka, topics, group_id, tmp_path):
    names = topics(partitions=4)
    group, state = group_id("auditor"), tmp_path / "auditor.sqlite"
    truths = asyncio.run(hand_over(kafka, names, lambda: auditor(kafka, names, group, state=state),
                                   SimulatorConfig(sessions=40, seed=74, min_turns=3, max_turns=4,
                                                   faults=FaultPlan(unlogged=2, dropped=1, lossless=1))))
    expected = expected_findings(truths)
    got = _findings(kafka, names, expected)
    assert got == expected, f"extra: {got - expected}, missing: {expected - got}"
