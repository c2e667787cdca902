"""The broker stops and comes back on the same address mid-run: the
projector's /healthz goes 503 and back, it resumes by itself, and its views
end exactly at the ground truth."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import pytest

from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.local_kafka import LocalKafka
from dsh_pipeline.local_resources import free_ports
from dsh_pipeline.ops_server import consumers_health
from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet, views_match
from tests.kafka_fixtures import caught_up
from tests.services import projector
from tests.waiting import until, wait_for

pytestmark = pytest.mark.kafka


def test_a_broker_restart_on_the_same_address_is_ridden_out(tmp_path):
    broker = LocalKafka(tmp_path / "broker", heap="512m")
    bootstrap = broker.start()
    kafka = KafkaConfig(bootstrap)
    names = TopicNames.with_prefix(f"r{uuid.uuid4().hex[:6]}.")
    first = SimulatorConfig(sessions=10, seed=81, max_turns=2)
    second = SimulatorConfig(sessions=10, seed=82, max_turns=2)
    service = projector(kafka, names, "dsh-restart", tmp_path / "views.sqlite")
    check = consumers_health({"projector": service}, stale_after=3)
    seen: list[tuple[bool, str]] = []

    async def scenario() -> list:
        await prepare_topics(kafka, names, 3)
        truths = await publish_fleet(kafka, names, first)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        try:
            ends = await end_offsets(kafka, names.events)
            await until(lambda: caught_up(service, ends) and check()[0], 60, "the first fleet")
            seen.append(check())
            await asyncio.to_thread(broker.stop)  # SIGTERM: the broker shuts down cleanly
            await until(lambda: not check()[0], 30, "the outage to show")
            seen.append(check())
            assert await asyncio.to_thread(broker.start) == bootstrap  # the same address again
            truths += await publish_fleet(kafka, names, second)
            ends = await end_offsets(kafka, names.events)
            await until(lambda: caught_up(service, ends) and check()[0], 120, "the projector to resume")
            seen.append(check())
            assert not task.done()
        finally:
            stop.set()
            await task
        return truths

    try:
        truths = asyncio.run(scenario())
    finally:
        broker.stop()
    assert seen[0] == seen[2] == (True, "ok") and not seen[1][0], seen
    assert views_match(tmp_path / "views.sqlite", truths)



def test_a_command_started_before_its_broker_waits_for_it(tmp_path):
    """--wait-for-cluster: no broker answers yet, so the command tries again
    with backoff (saying so) until one does, then runs."""
    port = free_ports(1)[0]
    log = tmp_path / "simulate.err"
    with open(log, "wb") as err:
        waiting = subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "2",
                                    "--bootstrap", f"127.0.0.1:{port}", "--wait-for-cluster", "120", "--partitions",
                                    "2", "--topic-prefix", f"wait{uuid.uuid4().hex[:6]}."],
                                   stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        wait_for(lambda: waiting.poll() is not None or b"trying again for up to 120 s" in log.read_bytes(), 60,
                 "the command saying it waits for the cluster")
        assert waiting.poll() is None, log.read_text()
        with LocalKafka(heap="512m", port=port):
            out, _ = waiting.communicate(timeout=180)
        assert waiting.returncode == 0, log.read_text()[-1500:]
        assert out.startswith("simulated 2 sessions"), out
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
