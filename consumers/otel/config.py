"""What the OpenTelemetry exporter is configured with (no SDK import here:
the command's parser reads it without the ``otel`` extra installed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsh_kafka.config import Secret

from ..runtime.config import ServiceConfig

__all__ = ["OtelExportConfig", "OtlpSettings"]


@dataclass(frozen=True, kw_only=True)
class OtlpSettings:
    """Where and how spans go; ``None`` leaves a setting to the SDK's
    ``OTEL_EXPORTER_OTLP_TRACES_*`` / ``OTEL_EXPORTER_OTLP_*`` variables."""

    endpoint: str | None = None  # the full traces URL, e.g. http://collector:4318/v1/traces
    headers: Secret | None = None  # "name=value" pairs, comma-separated, as OTEL_EXPORTER_OTLP_HEADERS
    ca_file: Path | None = None
    timeout_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class OtelExportConfig(ServiceConfig):
    state: Path  # the exporter's state file (SQLite)
    otlp: OtlpSettings = field(default_factory=OtlpSettings)
    content: bool = False  # message content, tool arguments and results on the spans (opt-in)
    group: str = "dsh-otel-exporter"
