"""/healthz tells the truth about the cluster: a consumer service whose
broker stops answering turns unhealthy, though its own loop goes on."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from consumers.runtime import ServiceState
from dsh_kafka.admin import prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.local_kafka import LocalKafka
from dsh_pipeline.ops_server import consumers_health
from tests.services import projector
from tests.waiting import until

pytestmark = pytest.mark.kafka


def test_a_silent_broker_makes_a_polling_service_unhealthy(tmp_path):
    with LocalKafka(heap="512m") as broker:
        kafka = KafkaConfig(broker.bootstrap)
        names = TopicNames.with_prefix(f"h{uuid.uuid4().hex[:8]}.")
        asyncio.run(prepare_topics(kafka, names, 2))
        service = projector(kafka, names, "health", tmp_path / "views.sqlite")
        check = consumers_health({"projector": service}, stale_after=3)

        async def scenario() -> list[tuple[bool, str]]:
            stop = asyncio.Event()
            task = asyncio.create_task(service.run(stop))
            seen = []
            try:
                await until(lambda: bool(service.silences()) and check()[0], 60, "a healthy service")
                seen.append(check())
                os.kill(broker.process.pid, signal.SIGSTOP)  # the broker hangs: connections stay open
                try:
                    await until(lambda: not check()[0], 30, "the silence to show")
                    seen.append(check())
                    assert not task.done() and service.state is ServiceState.RUNNING  # the loop itself went on polling
                finally:
                    os.kill(broker.process.pid, signal.SIGCONT)
                await until(lambda: check()[0], 60, "health to come back")
                seen.append(check())
            finally:
                stop.set()
                await task
            return seen

        healthy, silent, again = asyncio.run(scenario())
    assert healthy == again == (True, "ok")
    assert silent[1].startswith(f"projector: no answer from the cluster for {names.events}[0] for ") and silent[
        1].endswith(" s (stale after 3 s)") and f"{names.events}[1] for " in silent[1], silent
