"""Progress a consumer service reports while it reads a backlog: its lag from
the moment partitions arrive, and "caught up" only once every partition is
read to the end offset the cluster gave."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import REGISTRY

from consumers.runtime.metrics import LAG
from dsh_kafka.admin import end_offsets
from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import caught_up
from tests.services import projector
from tests.waiting import until

pytestmark = pytest.mark.kafka


class _Snapshots(logging.Handler):
    """At each progress line of the service: what its positions and lag
    gauge said at that moment. At the assignment's line it pauses fetching,
    as a slow first fetch would: polls end before the cluster answered any."""

    def __init__(self, service) -> None:
        super().__init__()
        self.service = service
        self.seen: list[tuple[str, dict[int, int], dict[str, float]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("assigned partitions"):
            self.service.consumer.pause(*self.service.assignment())
        if message.startswith(("assigned partitions", "caught up")):
            positions = {tp.partition: offset for tp, offset in self.service.positions().items()}
            lag = {sample.labels["partition"]: sample.value for metric in REGISTRY.collect()
                   if metric.name == "dsh_consumer_lag_records" for sample in metric.samples
                   if sample.labels["service"] == self.service.name}
            self.seen.append((message, positions, lag))


def test_caught_up_is_said_only_once_the_backlog_is_read(kafka, topics, group_id, tmp_path):
    LAG.clear()  # no gauge left by an earlier test's service
    names = topics(partitions=4)
    service = projector(kafka, names, group_id("progress"), tmp_path / "views.sqlite", max_records=20)
    snapshots = _Snapshots(service)
    logger = logging.getLogger(f"dsh.{service.name}")
    logger.addHandler(snapshots)
    level = logger.level
    logger.setLevel(logging.INFO)

    async def scenario() -> dict[int, int]:
        await publish_fleet(kafka, names, SimulatorConfig(sessions=24, seed=5, max_turns=2))
        ends = await end_offsets(kafka, names.events)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        try:
            await until(lambda: len(service.positions()) == len(ends) or task.done(), 120, "the assignment")
            paused = service.last_poll
            await until(lambda: service.last_poll > paused + 1 or task.done(), 60, "a second of unanswered polls")
            service.consumer.resume(*service.assignment())
            await until(lambda: caught_up(service, ends) and len(snapshots.seen) > 1 or task.done(), 120,
                        "the backlog to be read")
        finally:
            stop.set()
            await task
        return ends

    try:
        ends = asyncio.run(scenario())
    finally:
        logger.removeHandler(snapshots)
        logger.setLevel(level)
    (assigned, _, lag_then), (said, positions, lag_now) = snapshots.seen
    assert said == "caught up: every assigned partition read to its end"
    assert positions == ends and set(lag_now.values()) == {0.0}
    # the lag gauge shows every partition's backlog from the assignment on
    backlog = sum(ends.values())
    assert assigned == f"assigned partitions {names.events} [0, 1, 2, 3]: {backlog} record(s) to read"
    assert lag_then == {str(partition): float(end) for partition, end in ends.items()}
