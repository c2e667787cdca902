"""``dsh-pipeline export-otel``: every session's turns, steps and tool calls
as OpenTelemetry GenAI spans, sent over OTLP/HTTP (:mod:`consumers.otel`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from consumers.otel import OtelExportConfig, OtlpSettings
from dsh_core.errors import PipelineError
from dsh_kafka.config import Secret

__all__ = ["add_export_otel", "export_otel", "read_headers_file"]


def add_export_otel(commands: argparse._SubParsersAction,
                    add_consumer_options: Callable[[argparse.ArgumentParser, type], None]) -> None:
    parser = commands.add_parser(
        "export-otel", help="send every session's turns, steps and tool calls as OpenTelemetry GenAI spans (OTLP)")
    parser.add_argument("--state", default="otel-exporter-state.sqlite",
                        help="the SQLite state file (each session's next seq and open spans, written once the "
                             "receiver accepted a batch; a restart goes on from it)")
    parser.add_argument("--otlp-endpoint", metavar="URL",
                        help="the OTLP/HTTP traces URL, e.g. http://localhost:4318/v1/traces (default: "
                             "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, "
                             "else http://localhost:4318/v1/traces)")
    parser.add_argument("--otlp-headers-file", metavar="FILE",
                        help="headers sent with every request, name=value per line, mode 0600 (default: "
                             "$OTEL_EXPORTER_OTLP_TRACES_HEADERS or $OTEL_EXPORTER_OTLP_HEADERS)")
    parser.add_argument("--otlp-ca", metavar="FILE",
                        help="the CA certificate an https endpoint is checked against (default: "
                             "$OTEL_EXPORTER_OTLP_CERTIFICATE, else the system's)")
    parser.add_argument("--otlp-timeout", type=float, metavar="SECONDS",
                        help="how long one export may take, retries included (default: $OTEL_EXPORTER_OTLP_TIMEOUT, "
                             "else 10)")
    parser.add_argument("--content", action="store_true",
                        help="also send message content: gen_ai.input.messages and gen_ai.output.messages, tool "
                             "arguments and results (off by default: spans carry names, models, usage and times)")
    add_consumer_options(parser, OtelExportConfig)
    parser.set_defaults(run=export_otel)


def read_headers_file(path: str) -> Secret:
    """The headers in ``path``: ``name=value`` a line, ``#`` comments; the
    file must be its owner's alone, like every secret file here."""
    from producers.gateway_admission import read_secret_file
    pairs = []
    for number, line in enumerate(read_secret_file(path, "--otlp-headers-file").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals or not name.strip():
            raise PipelineError(f"--otlp-headers-file {path}, line {number}: expected name=value")
        pairs.append(f"{name.strip()}={value.strip()}")
    return Secret(",".join(pairs))


def export_otel(args: argparse.Namespace) -> int:
    from consumers.otel import otel_export_service
    from dsh_pipeline.service_commands import _consume, service_config
    otlp = OtlpSettings(endpoint=args.otlp_endpoint,
                        headers=read_headers_file(args.otlp_headers_file) if args.otlp_headers_file else None,
                        ca_file=Path(args.otlp_ca) if args.otlp_ca else None, timeout_seconds=args.otlp_timeout)
    if otlp.ca_file is not None and not otlp.ca_file.is_file():
        raise PipelineError(f"--otlp-ca {otlp.ca_file}: no such file")
    return _consume(args, lambda kafka, names: otel_export_service(
        service_config(args, OtelExportConfig, kafka, names, state=Path(args.state), otlp=otlp,
                       content=args.content)))
