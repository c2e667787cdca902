"""A session whose header is lost: the auditor reports it once, holds the
records, and audits the session clean once the header is re-shipped."""

from __future__ import annotations

import asyncio
import json

import pytest

from consumers.runtime import ConsumerService
from dsh_kafka.records import KIND_HEADER
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import caught_up, consume_all, end_offsets, publish_records
from tests.services import auditor

pytestmark = pytest.mark.kafka


def test_lost_header_is_reported_and_heals(kafka, topics, group_id):
    names = topics(partitions=2)
    truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=9, min_turns=2, max_turns=2), 0)
    records = [r for batch in batches for r in batch]
    header = next(r for r in records if r.kind == KIND_HEADER)
    group = group_id("auditor")


    async def audit() -> ConsumerService:
        ends = await end_offsets(kafka, names.events)
        service = auditor(kafka, names, group)
        await run_until(service, lambda: caught_up(service, ends))
        return service

    asyncio.run(publish_records(kafka, names, [r for r in records if r is not header]))
    asyncio.run(audit())
    asyncio.run(publish_records(kafka, names, [header]))  # re-shipped: the held records follow it
    healed = asyncio.run(audit()).policy.sessions.get(truth.session_id)
    assert healed.fold.count == truth.next_seq and not healed.held and not healed.pending
    findings = [json.loads(r.value) for r in asyncio.run(consume_all(kafka, names.findings, 1, timeout=30, settle=1.5,
                                                                     committed_only=True))]
    assert [(f["rule"], f["session"], f["seq"]) for f in findings] == [("sequence-gap", truth.session_id, 0)]
    assert "the session header is missing" in findings[0]["detail"]
