"""A cluster that wants SASL (PLAIN, SCRAM, OAUTHBEARER), or SASL over TLS:
the pipeline reaches it with the security settings of the environment, and
wrong credentials are a named error."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from dsh_core.errors import PipelineError
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.local_kafka import LocalKafka
from dsh_pipeline.secure_broker import make_certificates
from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet, run_until, views_match
from tests.kafka_fixtures import caught_up
from tests.services import projector

pytestmark = pytest.mark.kafka


def _sasl_env(password: str, protocol: str = "SASL_PLAINTEXT", mechanism: str = "PLAIN") -> dict[str, str]:
    return {"DSH_KAFKA_SECURITY_PROTOCOL": protocol, "DSH_KAFKA_SASL_MECHANISM": mechanism,
            "DSH_KAFKA_SASL_USERNAME": "dsh", "DSH_KAFKA_SASL_PASSWORD": password}


async def _fleet_projected(kafka: KafkaConfig, names: TopicNames, db: Path, seed: int) -> bool:
    """Set up the topics, publish a small fleet and project it, all as
    ``kafka`` says; whether the views are the fleet's truth."""
    await prepare_topics(kafka, names, 2)
    truths = await publish_fleet(kafka, names, SimulatorConfig(sessions=4, seed=seed, max_turns=2))
    ends = await end_offsets(kafka, names.events)
    service = projector(kafka, names, "dsh-secured-projector", db)
    await run_until(service, lambda: caught_up(service, ends))
    return views_match(db, truths)


def test_scram_over_tls_with_the_environment_s_ca_file(tmp_path):
    ca, keystore = make_certificates(tmp_path)
    with LocalKafka(heap="512m", sasl_users={"dsh": "s3cret"}, tls_keystore=keystore) as broker:
        kafka = KafkaConfig.from_env(broker.secured_bootstrap,  # as managed clusters do: SCRAM over TLS
                                     _sasl_env("s3cret", "SASL_SSL", "SCRAM-SHA-512") | {"DSH_KAFKA_SSL_CAFILE": str(ca)})
        names = TopicNames.with_prefix(f"tls{uuid.uuid4().hex[:6]}.")
        assert asyncio.run(_fleet_projected(kafka, names, tmp_path / "views.sqlite", seed=62))
        untrusted = KafkaConfig.from_env(broker.secured_bootstrap, _sasl_env("s3cret", "SASL_SSL"))  # system CAs
        with pytest.raises(PipelineError, match="cannot reach the Kafka cluster at .* over SASL_SSL: .* answered but the "
                                                "TLS handshake failed \\(CERTIFICATE_VERIFY_FAILED\\): check the CA file"):
            asyncio.run(prepare_topics(untrusted, names, 2))


def test_a_sasl_cluster_is_reached_with_the_environment_s_credentials(tmp_path):
    with LocalKafka(heap="512m", sasl_users={"dsh": "s3cret"}) as broker:
        properties = broker.data_dir / "server.properties"
        assert "s3cret" in properties.read_text() and properties.stat().st_mode & 0o077 == 0  # the owner's only
        kafka = KafkaConfig.from_env(broker.secured_bootstrap, _sasl_env("s3cret"))
        names = TopicNames.with_prefix(f"sasl{uuid.uuid4().hex[:6]}.")
        assert asyncio.run(_fleet_projected(kafka, names, tmp_path / "views.sqlite", seed=61))

        demo = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "demo", "--sessions", "30", "--bootstrap",
                               broker.secured_bootstrap, "--workdir", str(tmp_path / "demo")],
                              env={**os.environ, **_sasl_env("s3cret")}, capture_output=True, text=True, timeout=300)
        assert demo.returncode == 0 and "everything agrees" in demo.stdout, demo.stdout[-1500:] + demo.stderr[-1500:]
        refused = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "1",
                                  "--bootstrap", broker.secured_bootstrap],
                                 env={**os.environ, **_sasl_env("wrong")}, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 69 and "Traceback" not in refused.stderr, refused.stderr
    assert "SaslAuthenticationFailed" in refused.stderr  # the client's own line, then ours
    assert (f"dsh-pipeline simulate: ClusterUnavailableError: cannot reach the Kafka cluster at {broker.secured_bootstrap} over "
            f"SASL_PLAINTEXT: the broker at {broker.secured_bootstrap} took the connection over SASL_PLAINTEXT but refused "
            "the SASL PLAIN login of user 'dsh': check the user name, the password") in refused.stderr


def test_the_listed_acls_are_all_the_pipeline_needs(tmp_path):
    from dsh_kafka.acls import pipeline_acls
    from dsh_kafka.acls import grant
    from tests.services import archiver, auditor

    users = {"dsh": "s3cret", "stranger": "s3cret", "reader": "s3cret", "nowriter": "s3cret"}
    with LocalKafka(heap="512m", sasl_users=users, authorize=True) as broker:
        names = TopicNames.with_prefix(f"acl{uuid.uuid4().hex[:6]}.")
        listed = pipeline_acls("User:dsh", names)
        asyncio.run(grant(KafkaConfig(broker.bootstrap), listed + [  # a reader of the topics, in no group
            replace(acl, principal="User:reader") for acl in listed if acl.resource == "topic"] + [
            replace(acl, principal="User:nowriter") for acl in listed if acl.operation != "Write"]))
        kafka = KafkaConfig.from_env(broker.secured_bootstrap, _sasl_env("s3cret"))

        async def scenario():
            await prepare_topics(kafka, names, 2)
            truths = await publish_fleet(kafka, names, SimulatorConfig(sessions=4, seed=63, max_turns=2))
            ends = await end_offsets(kafka, names.events)
            services = [projector(kafka, names, "dsh-projector", tmp_path / "views.sqlite"),
                        auditor(kafka, names, "dsh-auditor"), archiver(kafka, names, "dsh-archiver", tmp_path / "a")]
            await asyncio.gather(*(run_until(s, lambda s=s: caught_up(s, ends)) for s in services))
            return truths

        assert views_match(tmp_path / "views.sqlite", asyncio.run(scenario()))
        def as_user(name: str) -> KafkaConfig:
            return KafkaConfig.from_env(broker.secured_bootstrap, {**_sasl_env("s3cret"), "DSH_KAFKA_SASL_USERNAME": name})

        with pytest.raises(PipelineError, match=r"the cluster refused User:stranger to create topic acl.*: it needs "
                                                r"the ACLs `dsh-pipeline acls` lists"):
            asyncio.run(prepare_topics(as_user("stranger"), names, 2))
        nowriter = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "1",
                                   "--bootstrap", broker.secured_bootstrap, "--topic-prefix", names.events[:-18],
                                   "--partitions", "2"],
                                  env={**os.environ, **_sasl_env("s3cret"), "DSH_KAFKA_SASL_USERNAME": "nowriter"},
                                  capture_output=True, text=True, timeout=120)
        assert nowriter.returncode == 69 and "Traceback" not in nowriter.stderr, nowriter.stderr
        assert "could not start: the cluster refused this client (ClusterAuthorizationFailedError)" in nowriter.stderr
        reader = projector(as_user("reader"), names, "dsh-reader", tmp_path / "reader.sqlite")
        with pytest.raises(PipelineError, match=r"the cluster refused this projector \(GroupAuthorizationFailedError\)"):
            asyncio.run(asyncio.wait_for(reader.run(asyncio.Event()), 60))


def _unsigned_token(subject: str, expires_in: float) -> str:
    """A JWT the broker's unsecured OAUTHBEARER validator takes (``alg: none``)."""
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    now = time.time()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now, 'exp': now + expires_in})}."


def test_oauthbearer_tokens_from_a_file_or_a_command(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(_unsigned_token("dsh", 3600))
    oauth = {"DSH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "DSH_KAFKA_SASL_MECHANISM": "OAUTHBEARER"}
    with LocalKafka(heap="512m", sasl_users={"dsh": "s3cret"}, unsigned_oauth=True) as broker:
        from_file = KafkaConfig.from_env(broker.secured_bootstrap, oauth | {"DSH_KAFKA_SASL_OAUTH_TOKEN_FILE": str(token_file)})
        assert asyncio.run(_fleet_projected(from_file, TopicNames.with_prefix(f"oauth{uuid.uuid4().hex[:6]}."),
                                            tmp_path / "file.sqlite", seed=63))
        command = f"{sys.executable} -c \"print(open('{token_file}').read())\""
        from_command = KafkaConfig.from_env(broker.secured_bootstrap, oauth | {"DSH_KAFKA_SASL_OAUTH_TOKEN_COMMAND": command})
        assert asyncio.run(_fleet_projected(from_command, TopicNames.with_prefix(f"oauth{uuid.uuid4().hex[:6]}."),
                                            tmp_path / "command.sqlite", seed=64))
        token_file.write_text(_unsigned_token("dsh", -60))  # expired: the file is read again, the broker refuses it
        with pytest.raises(PipelineError, match=f"refused the SASL OAUTHBEARER login with the token file {token_file}"):
            asyncio.run(prepare_topics(from_file, TopicNames.with_prefix("expired."), 2))


def test_mutual_tls_takes_a_client_certificate_and_refuses_a_client_without_one(tmp_path):
    ca, keystore = make_certificates(tmp_path, clients=["dsh-client"])
    certificate, key = tmp_path / "dsh-client.pem", tmp_path / "dsh-client.key"
    with LocalKafka(heap="512m", tls_keystore=keystore, client_ca=ca) as broker:
        tls = {"DSH_KAFKA_SECURITY_PROTOCOL": "SSL", "DSH_KAFKA_SSL_CAFILE": str(ca)}
        kafka = KafkaConfig.from_env(broker.secured_bootstrap, tls | {"DSH_KAFKA_SSL_CERTFILE": str(certificate),
                                                                      "DSH_KAFKA_SSL_KEYFILE": str(key)})
        names = TopicNames.with_prefix(f"mtls{uuid.uuid4().hex[:6]}.")
        assert asyncio.run(_fleet_projected(kafka, names, tmp_path / "views.sqlite", seed=65))
        anonymous = KafkaConfig.from_env(broker.secured_bootstrap, tls)
        with pytest.raises(PipelineError, match="over SSL: the broker at .* completed the TLS handshake but then "
                                                "refused this client, which has no certificate: the listener may "
                                                "require one \\(mutual TLS"):
            asyncio.run(prepare_topics(anonymous, names, 2))
