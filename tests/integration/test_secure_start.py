"""``dsh-pipeline kafka start --secure``: the local broker as a secured
cluster (SASL_SSL, a SCRAM user per service, ACLs per service), and the
whole pipeline (publisher, shipper, projector, auditor, archiver) run
through it with each service as its own user."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
from types import SimpleNamespace

import pytest

from dsh_core.errors import ClusterUnavailableError
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.config_file import KAFKA_KEYS
from dsh_pipeline.local_kafka import stop_detached
from dsh_pipeline.secure_broker import USERS
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.test_projector import run_until, views_match
from tests.conftest import corpus_logs, expected_of
from tests.kafka_fixtures import caught_up
from tests.layout_helpers import place
from tests.services import archiver, auditor, projector

pytestmark = pytest.mark.kafka


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, **(env or {})})


def test_each_service_runs_as_its_own_user_with_only_its_acls(tmp_path):
    data = tmp_path / "broker"
    started = _cli("kafka", "start", "--secure", "--data-dir", str(data))
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        secured = started.stdout.strip()
        assert f"each service's configuration: dsh-pipeline --config {data / 'clients'}/" in started.stderr
        files = {service: data / "clients" / f"{service}.toml" for service in USERS}
        assert all(f'bootstrap = "{secured}"' in path.read_text() for path in files.values())
        assert all(path.stat().st_mode & 0o077 == 0 for path in (data / "secrets").iterdir())
        again = _cli("kafka", "start", "--secure", "--data-dir", str(data))
        assert (again.returncode, again.stdout.strip()) == (0, secured)

        simulated = _cli("--config", str(files["publisher"]), "simulate", "--sessions", "12", "--seed", "71",
                         "--format", "0,3,4", "--manifest", str(tmp_path / "manifest.json"))
        assert simulated.returncode == 0, simulated.stderr[-2000:]
        root = tmp_path / "sessions"
        shipped = [log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"]][:3]
        for log in shipped:
            place(root, log.read_bytes(), "zstd")
        ship = _cli("--config", str(files["shipper"]), "ship", "--once", "--root", str(root))
        assert ship.returncode == 0, ship.stderr[-2000:]

        def as_user(service: str) -> KafkaConfig:  # the file's [kafka] table, as the command line reads it
            table = tomllib.loads(files[service].read_text())["kafka"]
            return KafkaConfig.from_env(None, {KAFKA_KEYS[key]: value for key, value in table.items()})

        names = TopicNames()
        truths = json.loads((tmp_path / "manifest.json").read_text())["truth"]

        async def run() -> None:
            ends = await end_offsets(as_user("projector"), names.events)
            services = [projector(as_user("projector"), names, "dsh-projector", tmp_path / "views.sqlite"),
                        auditor(as_user("auditor"), names, "dsh-auditor"),
                        archiver(as_user("archiver"), names, "dsh-archiver", tmp_path / "archive")]
            await asyncio.gather(*(run_until(s, lambda s=s: caught_up(s, ends)) for s in services))

        asyncio.run(run())
        assert views_match(tmp_path / "views.sqlite", [SimpleNamespace(**truth) for truth in truths.values()])
        assert len(list((tmp_path / "archive").glob("*/*/session*.jsonl.zstd"))) == len(truths) + len(shipped)

        async def write_events_as(service: str) -> None:
            truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=72), 0)
            async with Publisher(as_user(service), names) as publisher:
                for record in next(batches):
                    await publisher.send(record)
                await publisher.flush()

        with pytest.raises(ClusterUnavailableError, match="refused"):  # only a producer's user may write events
            asyncio.run(write_events_as("projector"))
        with pytest.raises(ClusterUnavailableError, match="cannot reach the Kafka cluster"):  # plaintext: refused
            asyncio.run(prepare_topics(KafkaConfig(secured), names, 2))
    finally:
        stop_detached(data)

