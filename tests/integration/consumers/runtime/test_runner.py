"""Failures stop the service with their error.

aiokafka logs a rebalance listener's exception and carries on with the
rebalance; the runner must not: after a failed checkpoint or state rebuild,
what it holds in memory cannot be trusted. A failed offset commit stops it
too, even when no further batch comes."""

from __future__ import annotations

import asyncio

import pytest

from consumers.auditor import Audit, AuditorConfig, TransactionalOutputs
from consumers.projector import Projection, ProjectorConfig
from consumers.runtime import ConsumerService, ProducerOutputs
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session
from tests.services import projector

pytestmark = pytest.mark.kafka


class _Failure(RuntimeError):
    pass


def test_a_failed_assignment_stops_the_service(kafka, topics, group_id):
    names = topics(partitions=2)

    class Broken(Audit):
        async def assigned(self, partitions, committed):
            await super().assigned(partitions, committed)
            raise _Failure("the state rebuild failed")

    async def run() -> None:
        config = AuditorConfig(kafka=kafka, topics=names, group=group_id("auditor"))
        outputs = TransactionalOutputs(kafka, names, Audit.name, config.group)
        await asyncio.wait_for(ConsumerService(config, Broken(config), outputs).run(asyncio.Event()), 60)

    with pytest.raises(_Failure, match="the state rebuild failed"):
        asyncio.run(run())


def test_a_failed_revoke_checkpoint_stops_the_service(kafka, topics, group_id, tmp_path):
    names = topics(partitions=2)
    group = group_id("projector")

    class Broken(Projection):
        async def revoked(self, partitions):
            raise _Failure("the revoke checkpoint failed")

    async def run() -> None:
        config = ProjectorConfig(kafka=kafka, topics=names, group=group, store=tmp_path / "a.sqlite")
        first = ConsumerService(config, Broken(config), ProducerOutputs(kafka, names, Projection.name))
        task = asyncio.create_task(first.run(asyncio.Event()))
        deadline = asyncio.get_running_loop().time() + 60
        while not first.assignment():
            assert asyncio.get_running_loop().time() < deadline, "the first member got no partitions"
            await asyncio.sleep(0.05)  # wait-ok: polling a condition with a deadline
        stop = asyncio.Event()
        second = projector(kafka, names, group, tmp_path / "b.sqlite")
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

    class Broken(ProducerOutputs):
        async def commit(self, offsets):
            raise _Failure("the offset commit failed")

    async def run() -> None:
        async with Publisher(kafka, names) as publisher:
            for batch in simulate_session(SimulatorConfig(sessions=1, seed=3, max_turns=1), 0)[1]:
                await publisher.send_many(batch)
            await publisher.flush()
        config = ProjectorConfig(kafka=kafka, topics=names, group=group_id("p"), store=tmp_path / "views.sqlite")
        broken = ConsumerService(config, Projection(config), Broken(kafka, names, Projection.name))
        await asyncio.wait_for(broken.run(asyncio.Event()), 60)

    with pytest.raises(_Failure, match="the offset commit failed"):
        asyncio.run(run())
