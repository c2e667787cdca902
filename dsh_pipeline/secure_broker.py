"""``dsh-pipeline kafka start --secure``: the local broker as a secured cluster.

Beside the broker's own loopback listener it serves SASL_SSL: a CA and a
broker certificate made with ``openssl`` on the first start, one SCRAM-SHA-512
user per service (``dsh-shipper``, ``dsh-publisher``, ``dsh-projector``,
``dsh-auditor``, ``dsh-archiver``) with a random password, and the KRaft
authorizer with the pipeline's topics created and each user granted only
what its service needs (:func:`dsh_kafka.acls.service_acls`: the shipper may
write the events topic and nothing else, the projector read it and write
views and dead letters, ...). Each service gets a configuration file,
``<data>/clients/<service>.toml`` (``--config``), naming the secured
listener, its user, its password file and the CA; passwords and keys are
files only their owner may read, in ``<data>/secrets``. A later start of
the same folder keeps certificates, users and passwords.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from pathlib import Path

from dsh_core.errors import PipelineError
from dsh_kafka.acls import SERVICES, grant, service_acls
from dsh_kafka.admin import prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import DEFAULT_PARTITIONS, TopicNames

from .kafka_jars import require_tool
from .local_kafka import LocalKafka

__all__ = ["SecureBroker", "USERS", "client_certificate", "make_certificates"]

#: The SCRAM user of each service.
USERS = {service: f"dsh-{service}" for service in SERVICES}


def _private(path: Path, text: str) -> Path:
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    return path


def make_certificates(folder: Path) -> tuple[Path, Path]:
    """A CA and a broker certificate for 127.0.0.1 (made once); the CA file
    and the broker's keystore (its key, certificate and the CA, PEM)."""
    ca, keystore = folder / "ca.pem", folder / "broker-keystore.pem"
    if ca.exists() and keystore.exists():
        return ca, keystore
    openssl = require_tool("openssl", "make the secured broker's certificates")

    def run(*args: str) -> None:
        done = subprocess.run([openssl, *args], cwd=folder, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PipelineError(f"openssl {args[0]} failed in {folder}: {done.stderr.strip()[-500:]}")

    old = os.umask(0o077)  # keys readable by their owner only
    try:
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
            "-subj", "/CN=dsh-pipeline local CA")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr", "-subj",
            "/CN=127.0.0.1")
        (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        run("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "broker.pem", "-days", "3650", "-extfile", "san.ext")
        _private(keystore, (folder / "broker.key").read_text() + (folder / "broker.pem").read_text() + ca.read_text())
    finally:
        os.umask(old)
    return ca, keystore


def client_certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A client certificate for ``CN=name`` signed by the CA of
    :func:`make_certificates` in ``folder`` (mutual TLS): its PEM file and key."""
    openssl = require_tool("openssl", "make a client certificate")
    old = os.umask(0o077)
    try:
        for args in (("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                      f"/CN={name}"),
                     ("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                      "-out", f"{name}.pem", "-days", "3650")):
            done = subprocess.run([openssl, *args], cwd=folder, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise PipelineError(f"openssl {args[0]} failed in {folder}: {done.stderr.strip()[-500:]}")
    finally:
        os.umask(old)
    return folder / f"{name}.pem", folder / f"{name}.key"


class SecureBroker:
    """The local broker with a SASL_SSL listener, users and ACLs per service."""

    def __init__(self, data_dir: Path, *, attached: bool = True, port: int | None = None, heap: str = "1g") -> None:
        self.data_dir = data_dir
        self.secrets = data_dir / "secrets"
        self.clients = data_dir / "clients"
        for folder in (self.secrets, self.clients):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.ca, keystore = make_certificates(self.secrets)
        self.passwords = {service: self._password(user) for service, user in USERS.items()}
        self.broker = LocalKafka(data_dir, attached=attached, port=port, heap=heap, tls_keystore=keystore,
                                 authorize=True, sasl_users={USERS[s]: p for s, p in self.passwords.items()})

    def _password(self, user: str) -> str:
        path = self.secrets / f"{user}.password"
        if not path.exists():
            _private(path, secrets.token_urlsafe(24) + "\n")
        return path.read_text().strip()

    def start(self, names: TopicNames = TopicNames(), partitions: int = DEFAULT_PARTITIONS) -> str:
        """Start the broker, create the topics and grant each service its
        ACLs (over the broker's own listener), write the clients' files;
        returns the secured listener's address."""
        self.broker.start()
        own = KafkaConfig(self.broker.bootstrap, client_id="dsh-pipeline-kafka-secure")
        acls = [acl for service, user in USERS.items() for acl in service_acls(f"User:{user}", service, names)]

        async def set_up() -> None:
            await prepare_topics(own, names, partitions)
            await grant(own, acls)

        asyncio.run(set_up())
        for service in USERS:
            self.config_file(service).write_text(self.client_config(service))
        return self.broker.secured_bootstrap

    def config_file(self, service: str) -> Path:
        return self.clients / f"{service}.toml"

    def client_config(self, service: str) -> str:
        """The ``--config`` file of ``service``: its ``[kafka]`` table."""
        settings = {"bootstrap": self.broker.secured_bootstrap, "security_protocol": "SASL_SSL",
                    "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": USERS[service],
                    "sasl_password_file": str(self.secrets / f"{USERS[service]}.password"), "ssl_cafile": str(self.ca)}
        return "[kafka]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())  # TOML strings

    def stop(self) -> None:
        self.broker.stop()
