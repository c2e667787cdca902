"""``dsh-pipeline kafka start --data-dir``: the broker it starts is the one
every other command without ``--bootstrap`` finds, and ``kafka status`` and
``stop`` without the flag act on it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from dsh_kafka.admin import end_offsets
from dsh_kafka.config import KafkaConfig
from dsh_pipeline.kafka_jars import KAFKA_VERSION, cache_root
from dsh_pipeline.local_kafka import stop_detached

pytestmark = pytest.mark.kafka


def test_a_broker_started_in_another_data_dir_is_the_one_the_other_commands_use(tmp_path):
    cache = tmp_path / "cache" / "dsh-pipeline"  # a cache of this test's own, holding the jars there are
    cache.mkdir(parents=True)
    (cache / f"kafka-{KAFKA_VERSION}").symlink_to(cache_root() / f"kafka-{KAFKA_VERSION}")
    environment = {name: value for name, value in os.environ.items() if name != "DSH_KAFKA_BOOTSTRAP"}
    environment["XDG_CACHE_HOME"] = str(tmp_path / "cache")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *args], capture_output=True, text=True,
                              timeout=180, env=environment)

    data = tmp_path / "elsewhere"
    try:
        started = cli("kafka", "start", "--data-dir", str(data))
        assert started.returncode == 0, started.stderr[-2000:]
        bootstrap = started.stdout.strip()
        status = cli("kafka", "status")
        assert (status.returncode, status.stdout) == (0, f"running pid {status.stdout.split()[2]} at {bootstrap} "
                                                         f"(data {data}, log {data / 'broker.log'})\n")
        simulated = cli("simulate", "--sessions", "3", "--topic-prefix", "elsewhere.")
        assert simulated.returncode == 0, simulated.stderr[-2000:]
        ends = asyncio.run(end_offsets(KafkaConfig(bootstrap), "elsewhere.dsh.session-events"))
        assert sum(ends.values()) > 3
        assert cli("kafka", "start").stdout == f"{bootstrap}\n"  # it runs: no second broker
        assert cli("kafka", "stop").stdout == "stopped\n"
        assert (cli("kafka", "status").stdout, not (cache / "broker").exists()) == ("not running\n", True)
    finally:
        stop_detached(data)
