"""A cluster that wants SASL: the pipeline reaches it with the security
settings of the environment, and wrong credentials are a named error."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.local_kafka import LocalKafka
from producers.simulator import SimulatorConfig
from tests.integration.test_projector import publish_fleet, run_until, views_match
from tests.kafka_fixtures import caught_up
from tests.services import projector

pytestmark = pytest.mark.kafka


def _sasl_env(password: str) -> dict[str, str]:
    return {"DSH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "DSH_KAFKA_SASL_MECHANISM": "PLAIN",
            "DSH_KAFKA_SASL_USERNAME": "dsh", "DSH_KAFKA_SASL_PASSWORD": password}


def test_a_sasl_cluster_is_reached_with_the_environment_s_credentials(tmp_path):
    with LocalKafka(heap="512m", sasl_users={"dsh": "s3cret"}) as broker:
        kafka = KafkaConfig.from_env(broker.sasl_bootstrap, _sasl_env("s3cret"))
        names = TopicNames.with_prefix(f"sasl{uuid.uuid4().hex[:6]}.")

        async def scenario():
            await prepare_topics(kafka, names, 3)
            truths = await publish_fleet(kafka, names, SimulatorConfig(sessions=5, seed=61, max_turns=2))
            ends = await end_offsets(kafka, names.events)
            service = projector(kafka, names, "sasl-projector", tmp_path / "views.sqlite")
            await run_until(service, lambda: caught_up(service, ends))
            return truths

        truths = asyncio.run(scenario())
        assert views_match(tmp_path / "views.sqlite", truths)

        refused = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "1",
                                  "--bootstrap", broker.sasl_bootstrap],
                                 env={**os.environ, **_sasl_env("wrong")}, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "SaslAuthenticationFailed" in refused.stderr  # the client's own line, then ours
    assert (f"dsh-pipeline simulate: PipelineError: cannot reach the Kafka cluster at {broker.sasl_bootstrap} over "
            "SASL_PLAINTEXT: no broker answered or took this client") in refused.stderr
