"""Typed, frozen client configuration, built once at the edge (CLI, env).

These say what the pipeline wants of its clients; :mod:`dsh_kafka.clients`
turns them into aiokafka clients (the only place that spells aiokafka's
option names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from dsh_core.errors import PipelineError

from .oauth import TokenSource
from .topics import MAX_MESSAGE_BYTES

__all__ = ["Secret", "KafkaConfig", "ProducerSettings", "ConsumerSettings", "BOOTSTRAP_ENV", "SECURITY_ENV",
           "SERVICE_PRODUCER"]

BOOTSTRAP_ENV = "DSH_KAFKA_BOOTSTRAP"


class Secret:
    """A value that never shows in reprs, logs or error messages."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"


#: The security settings a deployment gives through the environment.
SECURITY_ENV = ("DSH_KAFKA_SECURITY_PROTOCOL", "DSH_KAFKA_SASL_MECHANISM", "DSH_KAFKA_SASL_USERNAME",
                "DSH_KAFKA_SASL_PASSWORD", "DSH_KAFKA_SASL_PASSWORD_FILE", "DSH_KAFKA_SASL_OAUTH_TOKEN_FILE",
                "DSH_KAFKA_SASL_OAUTH_TOKEN_COMMAND", "DSH_KAFKA_SSL_CAFILE", "DSH_KAFKA_SSL_CERTFILE",
                "DSH_KAFKA_SSL_KEYFILE")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach the cluster: where, as whom, over what. ``extra``
    passes raw aiokafka options."""

    bootstrap: str
    client_id: str = "dsh-pipeline"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    sasl_oauth_token: TokenSource | None = None  # OAUTHBEARER: where tokens come from
    ssl_cafile: str | None = None  # PEM; None: the system's trusted CAs
    ssl_certfile: str | None = None  # PEM client certificate (mutual TLS) ...
    ssl_keyfile: str | None = None  # ... and its key
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not self.bootstrap or any(not part.rpartition(":")[2].isdigit() for part in self.bootstrap.split(",")):
            raise PipelineError(f"bootstrap {self.bootstrap!r} must be host:port[,host:port...]")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @classmethod
    def from_env(cls, bootstrap: str | None = None, environ: Mapping[str, str] = os.environ) -> "KafkaConfig":
        """``bootstrap`` or ``$DSH_KAFKA_BOOTSTRAP``, with the security
        settings of :data:`SECURITY_ENV`; a missing or unusable one is a
        :class:`PipelineError` naming the variable."""
        value = bootstrap or environ.get(BOOTSTRAP_ENV)
        if not value:
            raise PipelineError(f"no Kafka bootstrap given: pass --bootstrap or set {BOOTSTRAP_ENV}")
        protocol = environ.get("DSH_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper()
        if protocol not in _PROTOCOLS:
            raise PipelineError(f"DSH_KAFKA_SECURITY_PROTOCOL={protocol} is not one of {', '.join(_PROTOCOLS)}")
        settings: dict[str, Any] = {"security_protocol": protocol}
        if protocol.startswith("SASL_"):
            mechanism = environ.get("DSH_KAFKA_SASL_MECHANISM", "").upper()
            if mechanism not in _MECHANISMS:
                raise PipelineError(f"{protocol} needs DSH_KAFKA_SASL_MECHANISM, one of {', '.join(_MECHANISMS)}; "
                                    f"got {mechanism or 'nothing'}")
            if mechanism == "OAUTHBEARER":
                settings |= {"sasl_mechanism": mechanism, "sasl_oauth_token": _token_source(environ)}
            else:
                username = environ.get("DSH_KAFKA_SASL_USERNAME")
                if not username:
                    raise PipelineError(f"{protocol} needs DSH_KAFKA_SASL_USERNAME")
                settings |= {"sasl_mechanism": mechanism, "sasl_username": username,
                             "sasl_password": Secret(_password(environ))}
        for name, variable in (("ssl_cafile", "DSH_KAFKA_SSL_CAFILE"), ("ssl_certfile", "DSH_KAFKA_SSL_CERTFILE"),
                               ("ssl_keyfile", "DSH_KAFKA_SSL_KEYFILE")):
            path = environ.get(variable)
            if path:
                if not os.path.isfile(path):
                    raise PipelineError(f"{variable}={path}: no such file")
                settings[name] = path
        return cls(bootstrap=value, **settings)


def _token_source(environ: Mapping[str, str]) -> TokenSource:
    """OAUTHBEARER's token source: ``DSH_KAFKA_SASL_OAUTH_TOKEN_FILE`` or ``…_COMMAND``, exactly one."""
    path, command = (environ.get(f"DSH_KAFKA_SASL_OAUTH_TOKEN_{kind}") for kind in ("FILE", "COMMAND"))
    if path and not command:
        if not os.path.isfile(path):
            raise PipelineError(f"DSH_KAFKA_SASL_OAUTH_TOKEN_FILE={path}: no such file")
        return TokenSource("file", path)
    if command and not path:
        return TokenSource("command", command)
    raise PipelineError("OAUTHBEARER needs one of DSH_KAFKA_SASL_OAUTH_TOKEN_FILE (a file a token agent keeps "
                        "fresh) and DSH_KAFKA_SASL_OAUTH_TOKEN_COMMAND (a command printing a token)")


def _password(environ: Mapping[str, str]) -> str:
    """``DSH_KAFKA_SASL_PASSWORD``, or the first line of the file
    ``DSH_KAFKA_SASL_PASSWORD_FILE`` names (a mounted secret)."""
    path = environ.get("DSH_KAFKA_SASL_PASSWORD_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as stream:
                password = stream.readline().rstrip("\r\n")
        except OSError as error:
            raise PipelineError(f"DSH_KAFKA_SASL_PASSWORD_FILE={path}: {error.strerror or error}") from None
        if not password:
            raise PipelineError(f"DSH_KAFKA_SASL_PASSWORD_FILE={path}: the file's first line is empty")
        return password
    given = environ.get("DSH_KAFKA_SASL_PASSWORD")
    if not given:
        raise PipelineError("SASL needs DSH_KAFKA_SASL_PASSWORD or DSH_KAFKA_SASL_PASSWORD_FILE")
    return given


@dataclass(frozen=True)
class ProducerSettings:
    """Idempotent, ``acks=all`` producer tuned for throughput."""

    linger_ms: int = 10
    compression: Literal["zstd", "lz4", "gzip"] | None = "zstd"
    max_batch_bytes: int = 1024 * 1024
    max_record_bytes: int = MAX_MESSAGE_BYTES
    request_timeout_ms: int = 30_000
    #: The longest a publisher waits for the cluster, to queue a record or
    #: for the acknowledgement of what it queued, before it stops with a
    #: DeliveryTimeoutError; until then an outage is ridden out.
    delivery_timeout_s: float = 120.0


#: A service's own producer: every checkpoint flushes it, and a flush waits
#: out the linger, so lingering would only delay each batch's commit.
SERVICE_PRODUCER = ProducerSettings(linger_ms=0)


@dataclass(frozen=True)
class ConsumerSettings:
    """A consumer; offsets are committed by the service, never auto. Without
    ``group_id`` it reads assigned partitions outside any group."""

    group_id: str | None
    max_records: int = 10000
    fetch_max_bytes: int = 64 * 1024 * 1024
    max_partition_fetch_bytes: int = MAX_MESSAGE_BYTES + 1024 * 1024
    session_timeout_ms: int = 10_000  # without a heartbeat that long, the group moves the member's partitions
    max_poll_interval_ms: int = 300_000  # a member that does not poll that long leaves the group
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    #: A static member's id (KIP-345): a restart within the session timeout
    #: gets its partitions back without a rebalance of the group.
    group_instance_id: str | None = None

    @property
    def heartbeat_interval_ms(self) -> int:
        return max(100, min(3_000, self.session_timeout_ms // 3))
