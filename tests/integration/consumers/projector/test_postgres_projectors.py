"""Two projector processes in one group sharing one PostgreSQL view store,
as on two hosts: one is SIGKILLed mid-run and restarted, and the views end
equal to the ground truth."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from dsh_kafka.topics import TopicNames
from dsh_pipeline.local_postgres import create_database
from producers.simulator import FaultPlan, SimulatorConfig
from tests import postgres_fixture
from tests.integration.test_pipeline import check_views
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import group_lag
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka
postgres_dsn = postgres_fixture.postgres_dsn


def test_two_projectors_on_postgres_one_killed_and_restarted(kafka, topics, group_id, postgres_dsn):
    names = topics(partitions=6)
    faults = FaultPlan(dropped=2, duplicate=2, unknown=1)
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=200, seed=46, max_turns=5,
                                                                     faults=faults, formats=(0, 3, 4))))
    store = create_database(postgres_dsn, "test")
    group = group_id("projector")
    prefix = names.events[:-len(TopicNames().events)]
    command = [sys.executable, "-m", "dsh_pipeline.cli", "project", "--store", store, "--group", group,
               "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "6", "--max-records", "300",
               "--hot-sessions", "40", "--session-timeout", "6"]
    total = asyncio.run(group_lag(kafka, names.events, group))

    def lag() -> int:
        return asyncio.run(group_lag(kafka, names.events, group))

    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: lag() <= total * 2 // 3, 120, "both projectors under way")
        os.kill(second.pid, signal.SIGKILL)  # mid-run, between commits or inside one
        second.wait()
        second = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: lag() == 0, 180, "the group to finish")
    finally:
        for child in (first, second):
            child.send_signal(signal.SIGTERM)
        for child in (first, second):
            assert child.wait(60) == 0
    assert check_views(store, truths) == []
