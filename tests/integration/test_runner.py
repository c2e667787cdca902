"""Failures stop the service with their error.

aiokafka logs a rebalance listener's exception and carries on with the
rebalance; the runner must not: after a failed checkpoint or state rebuild,
what it holds in memory cannot be trusted. A failed offset commit stops it
too, even when no further batch comes."""

from __future__ import annotations

import asyncio

import pytest

from consumers.auditor import Auditor
from consumers.projector import Projector
from dsh_kafka.config import ConsumerSettings
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session

pytestmark = pytest.mark.kafka


class _Failure(RuntimeError):
    pass


def test_a_failed_assignment_stops_the_service(kafka, topics, group_id):
    names = topics(partitions=2)

    class Broken(Auditor):
        async def on_assign(self, partitions):
            await super().on_assign(partitions)
            raise _Failure("the state rebuild failed")

    async def run() -> None:
        await asyncio.wait_for(Broken(kafka, names, settings=ConsumerSettings(group_id=group_id("auditor")))
                               .run(asyncio.Event()), 60)

    with pytest.raises(_Failure, match="the state rebuild failed"):
        asyncio.run(run())


def test_a_failed_revoke_checkpoint_stops_the_service(kafka, topics, group_id, tmp_path):
    names = topics(partitions=2)
    group = group_id("projector")

    class Broken(Projector):
        async def on_revoke(self, partitions):
            raise _Failure("the revoke checkpoint failed")

    async def run() -> None:
        first = Broken(kafka, names, tmp_path / "a.sqlite", settings=ConsumerSettings(group_id=group))
        task = asyncio.create_task(first.run(asyncio.Event()))
        deadline = asyncio.get_running_loop().time() + 60
        while not first.consumer or not first.consumer.assignment():
            assert asyncio.get_running_loop().time() < deadline, "the first member got no partitions"
            await asyncio.sleep(0.05)  # wait-ok: polling a condition with a deadline
        stop = asyncio.Event()
        second = Projector(kafka, names, tmp_path / "b.sqlite", settings=ConsumerSettings(group_id=group))
        joining = asyncio.create_task(second.run(stop))  # its join revokes the first member's partitions
        try:
            await asyncio.wait_for(task, 60)
        finally:
            stop.set()
            await joining

    with pytest.raises(_Failure, match="the revoke checkpoint failed"):
        asyncio.run(run())


def test_a_failed_commit_stops_the_service_without_another_batch(kafka, topics, group_id, tmp_path):
    names = topics(partitions=1)

    class Broken(Projector):
        async def commit(self, offsets):
            raise _Failure("the offset commit failed")

    async def run() -> None:
        async with Publisher(kafka, names) as publisher:
            for batch in simulate_session(SimulatorConfig(sessions=1, seed=3, max_turns=1), 0)[1]:
                await publisher.send_many(batch)
            await publisher.flush()
        broken = Broken(kafka, names, tmp_path / "views.sqlite", settings=ConsumerSettings(group_id=group_id("p")))
        await asyncio.wait_for(broken.run(asyncio.Event()), 60)

    with pytest.raises(_Failure, match="the offset commit failed"):
        asyncio.run(run())
