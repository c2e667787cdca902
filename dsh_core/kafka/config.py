"""Typed, frozen client configuration, built once at the edge (CLI, env)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from ..errors import PipelineError
from .topics import MAX_MESSAGE_BYTES

__all__ = ["Secret", "KafkaConfig", "ProducerSettings", "ConsumerSettings", "BOOTSTRAP_ENV"]

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
    def from_env(cls, bootstrap: str | None = None, **overrides: Any) -> "KafkaConfig":
        """``bootstrap`` or ``$DSH_KAFKA_BOOTSTRAP``."""
        value = bootstrap or os.environ.get(BOOTSTRAP_ENV)
        if not value:
            raise PipelineError(f"no Kafka bootstrap given: pass --bootstrap or set {BOOTSTRAP_ENV}")
        return cls(bootstrap=value, **overrides)

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "client_id": self.client_id,
                                   "security_protocol": self.security_protocol}
        if self.sasl_mechanism:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.reveal() if self.sasl_password else None
        options.update(self.extra)
        return options


@dataclass(frozen=True)
class ProducerSettings:
    """Idempotent, ``acks=all`` producer tuned for throughput."""

    linger_ms: int = 10
    compression: Literal["zstd", "lz4", "gzip"] | None = "zstd"
    max_batch_bytes: int = 1024 * 1024
    max_record_bytes: int = MAX_MESSAGE_BYTES
    request_timeout_ms: int = 30_000

    def producer_options(self, kafka: KafkaConfig) -> dict[str, Any]:
        return {**kafka.client_options(), "enable_idempotence": True, "acks": "all",
                "linger_ms": self.linger_ms, "compression_type": self.compression,
                "max_batch_size": self.max_batch_bytes, "max_request_size": self.max_record_bytes + 64 * 1024,
                "request_timeout_ms": self.request_timeout_ms}


@dataclass(frozen=True)
class ConsumerSettings:
    """A consumer in a group; offsets are committed by the service, never auto."""

    group_id: str
    max_records: int = 10000
    fetch_max_bytes: int = 64 * 1024 * 1024
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"

    def consumer_options(self, kafka: KafkaConfig) -> dict[str, Any]:
        return {**kafka.client_options(), "group_id": self.group_id, "enable_auto_commit": False,
                "auto_offset_reset": self.auto_offset_reset, "max_partition_fetch_bytes": MAX_MESSAGE_BYTES + 1024 * 1024,
                "fetch_max_bytes": self.fetch_max_bytes, "session_timeout_ms": self.session_timeout_ms,
                "heartbeat_interval_ms": self.heartbeat_interval_ms, "isolation_level": "read_committed"}
