"""Copies, acknowledgements and retention of the topics a command creates
(``--replication``, ``--min-insync-replicas``, ``--retention``), as the
broker then reports them; more copies than brokers is named."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from dsh_kafka.clients import make_admin
from dsh_kafka.topics import TopicNames

pytestmark = pytest.mark.kafka


def _simulate(kafka, prefix: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "1", "--bootstrap",
                           kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "2", *options],
                          capture_output=True, text=True, timeout=120, check=False)


async def _configs(kafka, names: TopicNames) -> dict[str, dict[str, str]]:
    admin = make_admin(kafka)
    await admin.start()
    try:
        topics = (names.events, names.views, names.findings, names.dead_letter)
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
        return {name: {entry[0]: entry[1] for entry in entries}
                for response in responses for _, _, _, name, entries, *_ in response.resources}
    finally:
        await admin.close()


def test_new_topics_get_the_retention_and_acknowledgements_asked_for(kafka):
    prefix = f"layout{uuid.uuid4().hex[:6]}."
    done = _simulate(kafka, prefix, "--replication", "1", "--min-insync-replicas", "1", "--retention",
                     "events=604800000,findings=86400000")
    assert done.returncode == 0, done.stderr[-1500:]
    names = TopicNames.with_prefix(prefix)
    configs = asyncio.run(_configs(kafka, names))
    assert [configs[t]["retention.ms"] for t in (names.events, names.findings, names.dead_letter)] == [
        "604800000", "86400000", "-1"]
    assert configs[names.views]["cleanup.policy"] == "compact"
    assert {c["min.insync.replicas"] for c in configs.values()} == {"1"}


def test_more_copies_than_brokers_is_named(kafka):
    prefix = f"layout{uuid.uuid4().hex[:6]}."
    done = _simulate(kafka, prefix, "--replication", "3", "--wait-for-cluster", "1")
    assert done.returncode == 69 and "Traceback" not in done.stderr, done.stderr
    assert (f"BrokerOutageError: creating topic {prefix}dsh.session-events with 3 copies failed: fewer brokers are up "
            "than the topic's copies") in done.stderr


def test_a_weaker_existing_topic_is_named(kafka):
    prefix = f"layout{uuid.uuid4().hex[:6]}."
    assert _simulate(kafka, prefix, "--replication", "1", "--min-insync-replicas", "1").returncode == 0
    done = _simulate(kafka, prefix, "--replication", "1", "--min-insync-replicas", "2")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert (f"TopicMismatchError: topic {prefix}dsh.session-events has min.insync.replicas=1, below the 2 "
            "--min-insync-replicas asked") in done.stderr
