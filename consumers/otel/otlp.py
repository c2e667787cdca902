"""Mapped spans sent over OTLP/HTTP by the OpenTelemetry SDK's exporter.

The spans are finished already, with ids and times of their own
(:mod:`.spans`), so no tracer makes them: each becomes an SDK
:class:`~opentelemetry.sdk.trace.ReadableSpan` as it is, and the SDK's
:class:`OTLPSpanExporter` encodes and sends them (its retries, TLS, headers,
compression and ``OTEL_EXPORTER_OTLP_*`` variables). A batch is sent in
parts of at most :data:`SPANS_PER_REQUEST`; :meth:`OtlpSender.send` returns
only when the receiver accepted every part, or raises :class:`ExportError`.
"""

from __future__ import annotations

from typing import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from dsh_core.errors import PipelineError
from dsh_kafka.config import Secret

from .config import OtlpSettings
from .spans import SCHEMA_URL, GenAISpan

__all__ = ["CHARS_PER_REQUEST", "ExportError", "OtlpSender", "SPANS_PER_REQUEST", "request_parts"]

#: Spans per OTLP request, at most ...
SPANS_PER_REQUEST = 256
#: ... and characters of their text attributes (receivers refuse requests of a few MiB).
CHARS_PER_REQUEST = 1024 * 1024
_KINDS = {"client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}


class ExportError(PipelineError):
    """The OTLP receiver did not accept a batch of spans: nothing of the
    batch is committed, and the service stops (a restart sends it again,
    with the same span ids)."""


def _headers(secret: Secret | None) -> dict[str, str] | None:
    if secret is None:
        return None
    headers = {}
    for pair in secret.reveal().split(","):
        name, _, value = pair.partition("=")
        headers[name.strip().lower()] = value.strip()
    return headers


def _resource() -> Resource:
    """``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` as the SDK
    reads them; ``service.name`` ``dsh-pipeline`` where they name none."""
    given = Resource.create({})
    if str(given.attributes.get("service.name", "unknown_service")).startswith("unknown_service"):
        return given.merge(Resource({"service.name": "dsh-pipeline"}))
    return given


def request_parts(spans: Sequence[GenAISpan]) -> list[list[GenAISpan]]:
    """``spans`` in requests of at most :data:`SPANS_PER_REQUEST` spans and
    :data:`CHARS_PER_REQUEST` characters of text (one span at least each)."""
    parts: list[list[GenAISpan]] = [[]]
    chars = 0
    for span in spans:
        size = sum(len(value) for value in span.attributes.values() if isinstance(value, str))
        if parts[-1] and (len(parts[-1]) >= SPANS_PER_REQUEST or chars + size > CHARS_PER_REQUEST):
            parts.append([])
            chars = 0
        parts[-1].append(span)
        chars += size
    return [part for part in parts if part]


class OtlpSender:
    """One OTLP/HTTP exporter; :meth:`send` blocks (run it off the loop)."""

    def __init__(self, settings: OtlpSettings) -> None:
        self.settings = settings
        self.exporter = OTLPSpanExporter(
            endpoint=settings.endpoint, headers=_headers(settings.headers),
            certificate_file=str(settings.ca_file) if settings.ca_file is not None else None,
            timeout=settings.timeout_seconds)
        self.resource = _resource()
        self.scope = InstrumentationScope("dsh-pipeline.export-otel", schema_url=SCHEMA_URL)
        self.where = self.exporter._endpoint  # what the SDK resolved (flag, variable or its default)

    def send(self, spans: Sequence[GenAISpan]) -> None:
        for part in request_parts(spans):
            if self.exporter.export([self._readable(span) for span in part]) is not SpanExportResult.SUCCESS:
                raise ExportError(f"the OTLP receiver at {self.where} did not accept {len(part)} span(s) (the "
                                  "exporter's log line above says why); nothing of this batch is committed")

    def close(self) -> None:
        self.exporter.shutdown()

    def _readable(self, span: GenAISpan) -> ReadableSpan:
        context = SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        parent = (SpanContext(span.trace_id, span.parent_id, is_remote=False,
                              trace_flags=TraceFlags(TraceFlags.SAMPLED)) if span.parent_id is not None else None)
        attributes = dict(span.attributes)
        status = Status(StatusCode.UNSET)
        if span.error is not None:
            attributes["error.type"] = span.error
            status = Status(StatusCode.ERROR, span.error)
        return ReadableSpan(span.name, context=context, parent=parent, resource=self.resource,
                            attributes=attributes, kind=_KINDS[span.kind], status=status,
                            start_time=span.start_ms * 1_000_000, end_time=span.end_ms * 1_000_000,
                            instrumentation_scope=self.scope)
