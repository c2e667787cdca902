"""What a service logs while its broker restarts: the Kafka client's errors
once per cause with a count, not a line per retry; and JSON lines only."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import subprocess
import sys
import uuid

import pytest

from dsh_kafka.admin import prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.local_kafka import LocalKafka
from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet, views_match
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _projected(service: subprocess.Popen, store, truths) -> bool:
    assert service.poll() is None, "the projector stopped"
    return views_match(store, truths)


def test_a_broker_restart_gives_one_client_line_per_cause_with_a_count(tmp_path):
    broker = LocalKafka(tmp_path / "broker", heap="512m")
    bootstrap = broker.start(timeout=300)
    kafka = KafkaConfig(bootstrap)
    prefix = f"o{uuid.uuid4().hex[:6]}."
    names = TopicNames.with_prefix(prefix)
    store, log = tmp_path / "views.sqlite", tmp_path / "projector.log"
    asyncio.run(prepare_topics(kafka, names, 3))
    with open(log, "wb") as err:
        service = subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "project", "--store", str(store),
                                    "--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", "3",
                                    "--log-format", "json"],
                                   stderr=err)
    try:
        truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=4, seed=91, max_turns=1)))
        wait_for(lambda: _projected(service, store, truths), 120, "the projector to project the first fleet")
        broker.stop()
        wait_for(lambda: any(line["logger"].startswith("aiokafka") for line in _lines(log)), 60,
                 "the client to find the broker gone")
        assert broker.start(timeout=300) == bootstrap
        truths += asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=4, seed=92, max_turns=1)))
        wait_for(lambda: _projected(service, store, truths), 180, "the projector to resume")
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(60)
        broker.stop()
        print(log.read_text()[-5000:])  # shown when the test fails
    lines = _lines(log)  # every line is JSON
    assert service.returncode == 0, lines[-5:]
    client = [line for line in lines if line["logger"].startswith("aiokafka")]
    shown = collections.Counter((line["logger"], line["message"].split(":")[0]) for line in client
                                if "count" not in line)
    repeats = sum(line.get("count", 0) for line in client)
    # each cause shows once an interval (its repeats counted into one more line), however often the client retried
    assert max(shown.values()) <= 2 and repeats > 0, client
    assert all(line["service"] == "project" for line in lines)
