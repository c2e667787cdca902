"""A first start is quiet: topics just created are served by their leaders
before the command goes on, and a consumer starts once the cluster names
its group's coordinator, so no client logs the moments in between as
errors (a new broker makes its offsets topic at the first question)."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import uuid

import pytest

from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.records import header_record
from dsh_kafka.topics import TopicNames
from dsh_core.session_header import SessionHeader
from dsh_pipeline.local_kafka import LocalKafka
from producers.publisher import Publisher
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


def test_topics_just_created_are_read_and_written_without_a_client_error(kafka, caplog):
    names = TopicNames.with_prefix(f"first{uuid.uuid4().hex[:8]}.")

    async def first_use() -> dict[int, int]:
        await prepare_topics(kafka, names, 12)
        async with Publisher(kafka, names) as publisher:
            for index in range(24):  # a record on every partition, about
                await publisher.send(header_record(SessionHeader(id=f"s-{index}", createdAt=1, delegationDepth=0)))
            await publisher.flush()
        return await end_offsets(kafka, names.events)

    with caplog.at_level(logging.WARNING, logger="aiokafka"):
        ends = asyncio.run(first_use())
    assert sum(ends.values()) == 24 and len(ends) == 12
    assert [record.getMessage() for record in caplog.records if record.name.startswith("aiokafka")] == []


def test_a_service_s_first_start_on_a_new_broker_logs_no_error(tmp_path):
    with LocalKafka(heap="512m") as broker:  # a broker no group has asked for a coordinator yet
        bootstrap = broker.bootstrap
        log = tmp_path / "archiver.log"
        with open(log, "wb") as output:
            archiver = subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "archive", "--root",
                                         str(tmp_path / "archive"), "--bootstrap", bootstrap], stderr=output)
            try:
                wait_for(lambda: archiver.poll() is not None or "caught up" in log.read_text(), 120, "caught up")
                archiver.send_signal(signal.SIGTERM)
                status = archiver.wait(60)
            finally:
                archiver.kill()
                archiver.wait()
    assert status == 0, log.read_text()
    lines = log.read_text().splitlines()
    assert [line for line in lines if " INFO " not in line] == [], lines
    assert lines[-1].endswith("INFO dsh.archiver: stopped: everything handled is persisted and committed")
