"""A projector the group has replaced writes no view: the member that takes
a partition over claims it in the view store first, and the old member's
next batch is refused whole (real broker, both store backends)."""

from __future__ import annotations

import asyncio

import pytest

from consumers.projector import ViewStore
from dsh_kafka.errors import FencedError
from producers.simulator import SimulatorConfig, simulate_session
from tests import postgres_fixture
from tests.kafka_fixtures import committed_offsets, end_offsets, publish_records, wait_committed
from tests.services import projector

pytestmark = pytest.mark.kafka
postgres_dsn, store_location = postgres_fixture.postgres_dsn, postgres_fixture.store_location


def test_a_replaced_projector_is_fenced_by_the_store(kafka, topics, group_id, store_location):
    names = topics(partitions=1)
    config = SimulatorConfig(sessions=2, seed=19, min_turns=2, max_turns=2)
    first, second = ([r for batch in simulate_session(config, index)[1] for r in batch] for index in (0, 1))
    group = group_id("projector")

    async def committed() -> int:
        return (await committed_offsets(kafka, group)).get((names.events, 0), 0)

    async def scenario() -> tuple[int, int]:
        await publish_records(kafka, names, first)
        end = (await end_offsets(kafka, names.events))[0]
        stalled = projector(kafka, names, group, store_location)
        task = asyncio.create_task(stalled.run(asyncio.Event()))
        await wait_committed(kafka, group, names.events, end, task)
        successor = ViewStore(store_location)  # what a member assigned the partition does first
        try:
            successor.claim([0])
        finally:
            successor.close()
        await publish_records(kafka, names, second)
        with pytest.raises(FencedError, match=r"events partition 0 was taken over by a newer member"):
            await asyncio.wait_for(task, 60)
        return end, await committed()

    end, after = asyncio.run(scenario())
    assert after == end  # its offsets never moved past what it wrote before
    store = ViewStore(store_location)
    try:
        assert store.view(first[0].session_id)["status"] == "idle"
        assert store.view(second[0].session_id) is None  # nothing of the fenced batch landed
    finally:
        store.close()
