"""The OpenTelemetry exporter: sessions as OTLP spans of the GenAI semantic
conventions (:mod:`.spans` maps, :mod:`.otlp` sends through the SDK, only
loaded once the service starts, :mod:`.service` runs it on the consumer runtime)."""

from .config import OtelExportConfig, OtlpSettings
from .service import OtelExport, otel_export_service
from .spans import SCHEMA_URL, SEMCONV_VERSION, GenAISpan, SpanMapper

__all__ = ["GenAISpan", "OtelExport", "OtelExportConfig", "OtlpSettings", "SCHEMA_URL", "SEMCONV_VERSION",
           "SpanMapper", "otel_export_service"]
