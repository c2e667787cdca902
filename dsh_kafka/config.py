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

from .topics import MAX_MESSAGE_BYTES

__all__ = ["Secret", "KafkaConfig", "ProducerSettings", "ConsumerSettings", "BOOTSTRAP_ENV", "SERVICE_PRODUCER"]

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


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach the cluster. ``extra`` passes raw aiokafka options."""

    bootstrap: str
    client_id: str = "dsh-pipeline"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not self.bootstrap or any(not part.rpartition(":")[2].isdigit() for part in self.bootstrap.split(",")):
            raise PipelineError(f"bootstrap {self.bootstrap!r} must be host:port[,host:port...]")

    @classmethod
    def from_env(cls, bootstrap: str | None = None) -> "KafkaConfig":
        """``bootstrap`` or ``$DSH_KAFKA_BOOTSTRAP``."""
        value = bootstrap or os.environ.get(BOOTSTRAP_ENV)
        if not value:
            raise PipelineError(f"no Kafka bootstrap given: pass --bootstrap or set {BOOTSTRAP_ENV}")
        return cls(bootstrap=value)


@dataclass(frozen=True)
class ProducerSettings:
    """Idempotent, ``acks=all`` producer tuned for throughput."""

    linger_ms: int = 10
    compression: Literal["zstd", "lz4", "gzip"] | None = "zstd"
    max_batch_bytes: int = 1024 * 1024
    max_record_bytes: int = MAX_MESSAGE_BYTES
    request_timeout_ms: int = 30_000


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
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
