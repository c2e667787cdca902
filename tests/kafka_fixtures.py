"""Kafka fixtures: one real broker per test session, fresh topics per test.

Broker: ``$DSH_KAFKA_BOOTSTRAP`` when set; else a Docker engine's
testcontainers Kafka; else the project's own local broker (Maven jars).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from typing import Any, Iterator

import pytest

from dsh_kafka.config import BOOTSTRAP_ENV, KafkaConfig
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.clients import make_admin, make_consumer
from dsh_kafka.config import ConsumerSettings
from dsh_kafka.topics import TopicNames


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    configured = os.environ.get(BOOTSTRAP_ENV)
    if configured:
        yield configured
        return
    if _docker_available():
        from testcontainers.community.kafka import KafkaContainer
        with KafkaContainer("confluentinc/cp-kafka:7.6.0").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from dsh_pipeline.local_kafka import LocalKafka
    with LocalKafka(heap="768m") as broker:
        yield broker.bootstrap
        # Its folder goes with it: a controlled shutdown would only close the thousands of partitions the
        # session's topics made (30 s and more, then a SIGKILL anyway), so it ends at once.
        if broker.process is not None:
            broker.process.kill()
            broker.process.wait()


@pytest.fixture(scope="session")
def _local_cluster() -> Iterator[Any]:
    from dsh_pipeline.local_cluster import LocalCluster
    with LocalCluster(3) as cluster:
        yield cluster


@pytest.fixture
def kafka_cluster(_local_cluster: Any) -> Iterator[Any]:
    """The session's three-node cluster (:class:`~dsh_pipeline.local_cluster.LocalCluster`):
    a test may kill, stop or pause its nodes; after the test each serves again, its copies in sync."""
    yield _local_cluster
    for node in _local_cluster.nodes:
        if _local_cluster.running(node):
            _local_cluster.resume(node)
        else:
            _local_cluster.start_node(node)
    for node in _local_cluster.nodes:  # serving is not enough: the next test's fault would meet one copy in sync
        _local_cluster.wait_in_sync(node, time.monotonic() + 120)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaConfig:
    return KafkaConfig(bootstrap=kafka_bootstrap)


@pytest.fixture
def topics(kafka: KafkaConfig) -> Any:
    """A factory: fresh, created topic names for this test (unique prefix)."""
    def make(partitions: int = 12) -> TopicNames:
        names = TopicNames.with_prefix(f"t{uuid.uuid4().hex[:10]}.")
        asyncio.run(prepare_topics(kafka, names, partitions))
        return names
    return make


@pytest.fixture
def group_id() -> Any:
    return lambda role="g": f"{role}-{uuid.uuid4().hex[:10]}"


async def consume_all(kafka: KafkaConfig, topic: str, expected: int, timeout: float = 60.0,
                      group: str | None = None, settle: float = 0.0, committed_only: bool = False) -> list[Any]:
    """Read ``expected`` records from the start of ``topic`` (a deadline, not
    a sleep); with ``settle``, keep reading that long after to catch extras."""
    consumer = make_consumer(kafka, ConsumerSettings(
        group_id=group, isolation_level="read_committed" if committed_only else "read_uncommitted"), topic)
    await consumer.start()
    records: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while len(records) < expected and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for partition_records in batch.values():
                records.extend(partition_records)
        settled = loop.time() + settle
        while loop.time() < settled:
            batch = await consumer.getmany(timeout_ms=200)
            for partition_records in batch.values():
                records.extend(partition_records)
    finally:
        await consumer.stop()
    return records


async def publish_records(kafka: KafkaConfig, names: TopicNames, records: list[Any]) -> None:
    """Send session records to the events topic and wait for the cluster's acknowledgement."""
    from producers.publisher import Publisher
    async with Publisher(kafka, names) as publisher:
        await publisher.send_many(records)
        await publisher.flush()


async def wait_committed(kafka: KafkaConfig, group: str, topic: str, offset: int, service: asyncio.Task,
                         timeout: float = 60.0) -> None:
    """Wait until ``group`` has committed ``offset`` on partition 0 of ``topic``
    while ``service`` (the task running its member) still runs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (await committed_offsets(kafka, group)).get((topic, 0), 0) < offset:
        assert not service.done(), service
        assert loop.time() < deadline, f"group {group} did not commit offset {offset} of {topic}[0]"
        await asyncio.sleep(0.05)  # wait-ok: polling a condition with a deadline


def caught_up(service, ends: dict[int, int]) -> bool:
    """Whether a consumer service has read every partition to ``ends``."""
    consumed = {tp.partition: offset for tp, offset in service.positions().items()}
    return all(consumed.get(partition, 0) >= end for partition, end in ends.items() if end > 0)


async def committed_offsets(kafka: KafkaConfig, group: str) -> dict[tuple[str, int], int]:
    """A consumer group's committed offsets by ``(topic, partition)`` (none yet: empty)."""
    from aiokafka.errors import GroupCoordinatorNotAvailableError
    admin = make_admin(kafka)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    except GroupCoordinatorNotAvailableError:  # the group has not committed anything yet
        committed = {}
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items()}


async def group_lag(kafka: KafkaConfig, topic: str, group: str) -> int:
    """Records of ``topic`` a consumer group has not committed yet."""
    ends = await end_offsets(kafka, topic)
    committed = await committed_offsets(kafka, group)
    return sum(end - committed.get((topic, partition), 0) for partition, end in ends.items())
