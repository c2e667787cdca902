"""``dsh-pipeline kafka start --secure``: the local broker as a secured cluster.

No listener takes a client without credentials: the broker serves SASL_SSL
only, its controller listener included. A CA and a broker certificate are
made with ``openssl`` on the first start (the CA's key only lives, in a
private temporary folder, while it signs: nothing can be signed later, and
the running broker never holds it); one SCRAM-SHA-512 user per service
(``dsh-shipper``, ``dsh-publisher``, ``dsh-projector``, ``dsh-auditor``,
``dsh-archiver``) with a random password; an admin user (``dsh-admin``, the
only super user) that the broker's own connections, its readiness checks
and the set-up log in as; and the KRaft authorizer with the pipeline's
topics created and each user granted only what its service needs
(:func:`dsh_kafka.acls.service_acls`: the shipper may write the events topic
and nothing else, the projector read it and write views and dead letters,
...). Each service gets a configuration file,
``<data>/clients/<service>.toml`` (``--config``), naming the secured
listener, its user, its password file and the CA; passwords and keys are
files only their owner may read, in ``<data>/secrets``, and the data folder
is the owner's only (0700). A later start of the same folder keeps
certificates, users and passwords.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from dsh_core.errors import PipelineError
from dsh_kafka.acls import SERVICES, grant, service_acls
from dsh_kafka.admin import prepare_topics
from dsh_kafka.topics import DEFAULT_PARTITIONS, TopicNames

from .kafka_jars import require_tool
from .local_kafka import LocalKafka
from .local_resources import private_file

__all__ = ["ADMIN", "SecureBroker", "USERS", "make_certificates"]

#: The SCRAM user of each service.
USERS = {service: f"dsh-{service}" for service in SERVICES}
#: The broker's own user: its only super user, never a service's.
ADMIN = "dsh-admin"


def make_certificates(folder: Path, clients: Sequence[str] = ()) -> tuple[Path, Path]:
    """A CA and a broker certificate for 127.0.0.1 (made once), and a client
    certificate for ``CN=name`` of each of ``clients`` (mutual TLS:
    ``folder/name.pem`` and its key ``folder/name.key``). Returns the CA file
    and the broker's keystore (its key, certificate and the CA, PEM). The
    CA's key is made in a private temporary folder and removed once it has
    signed them: it is never beside the broker."""
    ca, keystore = folder / "ca.pem", folder / "broker-keystore.pem"
    if ca.exists() and keystore.exists():
        return ca, keystore
    openssl = require_tool("openssl", "make the secured broker's certificates")
    with tempfile.TemporaryDirectory(prefix="dsh-ca-") as signing:  # 0700: the keys' folder

        def run(*args: str) -> None:
            done = subprocess.run([openssl, *args], cwd=signing, capture_output=True, text=True, check=False,
                                  umask=0o077)
            if done.returncode != 0:
                raise PipelineError(f"openssl {args[0]} failed making certificates for {folder}: "
                                    f"{done.stderr.strip()[-500:]}")

        def sign(name: str, subject: str, *extensions: str) -> str:
            """``name``'s key and certificate signed by the CA, as PEM text."""
            run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", subject)
            run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "3650", *extensions)
            return (Path(signing) / f"{name}.key").read_text() + (Path(signing) / f"{name}.pem").read_text()

        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
            "-subj", "/CN=dsh-pipeline local CA")
        (Path(signing) / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        authority = (Path(signing) / "ca.pem").read_text()
        for name in clients:
            key_and_certificate = sign(name, f"/CN={name}")
            private_file(folder / f"{name}.key", (Path(signing) / f"{name}.key").read_text())
            private_file(folder / f"{name}.pem", key_and_certificate.split("-----END PRIVATE KEY-----\n")[1])
        private_file(keystore, sign("broker", "/CN=127.0.0.1", "-extfile", "san.ext") + authority)
        private_file(ca, authority)
    return ca, keystore


class SecureBroker:
    """The local broker serving SASL_SSL only, with users and ACLs per service."""

    def __init__(self, data_dir: Path, *, attached: bool = True, port: int | None = None, heap: str = "1g") -> None:
        self.data_dir = data_dir
        self.secrets = data_dir / "secrets"
        self.clients = data_dir / "clients"
        for folder in (data_dir, self.secrets, self.clients):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.chmod(0o700)
        # a folder an earlier version secured kept the CA's key beside the broker, and the signing leftovers
        for leftover in ("ca.key", "ca.srl", "broker.key", "broker.csr", "broker.pem", "san.ext"):
            (self.secrets / leftover).unlink(missing_ok=True)
        self.ca, keystore = make_certificates(self.secrets)
        self.passwords = {service: self._password(user) for service, user in USERS.items()}
        self._password(ADMIN)
        self.broker = LocalKafka(data_dir, attached=attached, port=port, heap=heap, tls_keystore=keystore,
                                 tls_ca=self.ca, authorize=True, admin=ADMIN,
                                 admin_password_file=self.password_file(ADMIN),
                                 sasl_users={USERS[s]: p for s, p in self.passwords.items()})

    def password_file(self, user: str) -> Path:
        return self.secrets / f"{user}.password"

    def _password(self, user: str) -> str:
        path = self.password_file(user)
        if not path.exists():
            private_file(path, secrets.token_urlsafe(24) + "\n")
        return path.read_text().strip()

    def start(self, names: TopicNames = TopicNames(), partitions: int = DEFAULT_PARTITIONS) -> str:
        """Start the broker, create the topics and grant each service its
        ACLs (as the admin user), write the clients' files; returns the
        secured listener's address."""
        bootstrap = self.broker.start()
        own = self.broker.admin_config("dsh-pipeline-kafka-secure")
        acls = [acl for service, user in USERS.items() for acl in service_acls(f"User:{user}", service, names)]

        async def set_up() -> None:
            await prepare_topics(own, names, partitions)
            await grant(own, acls)

        asyncio.run(set_up())
        for service in USERS:
            private_file(self.config_file(service), self.client_config(service))
        return bootstrap

    def config_file(self, service: str) -> Path:
        return self.clients / f"{service}.toml"

    def client_config(self, service: str) -> str:
        """The ``--config`` file of ``service``: its ``[kafka]`` table."""
        settings = {"bootstrap": self.broker.secured_bootstrap, "security_protocol": "SASL_SSL",
                    "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": USERS[service],
                    "sasl_password_file": str(self.password_file(USERS[service])), "ssl_cafile": str(self.ca)}
        return "[kafka]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())  # TOML strings

    def stop(self) -> None:
        self.broker.stop()
