"""Jaeger v2 (``make jaeger`` builds it) as the OTLP receiver of the
export-otel tests: one process per test on free loopback ports, with
in-memory storage, read back over its API v3 without the query adjusters
(``raw_traces``), so a span received twice shows twice.

A first build takes minutes of CPU: when a test session collects a test
that needs Jaeger and no binary is cached, :func:`build_in_background`
starts ``make jaeger`` at once and puts those tests last, so the build runs
beside the rest of the suite instead of before it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import ROOT
from tests.waiting import wait_for

_VERSION = re.search(r"^JAEGER_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
assert _VERSION is not None
JAEGER_VERSION = _VERSION.group(1)
BINARY = Path(os.environ.get("DSH_JAEGER") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
              / "dsh-pipeline" / f"jaeger-{JAEGER_VERSION}" / "jaeger")

#: ``make jaeger`` running beside the tests (:func:`build_in_background`), and its log.
_BUILD: tuple[subprocess.Popen[bytes], Path] | None = None
#: How long a test waits for that build (a cold one took 7.6 min of CPU).
_BUILD_DEADLINE_S = 20 * 60
_USES_JAEGER = "tests/integration/consumers/otel/"


def build_in_background(items: list[pytest.Item]) -> None:
    """Start ``make jaeger`` if a collected test needs Jaeger and none is
    built yet, and move those tests to the end of ``items``."""
    global _BUILD
    needing = [item for item in items if _USES_JAEGER in item.nodeid]
    if not needing:
        return
    items[:] = [item for item in items if _USES_JAEGER not in item.nodeid] + needing
    if BINARY.is_file() or _BUILD is not None:
        return
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    log = BINARY.parent / "build.log"
    with log.open("wb") as out:
        # a step below the tests in priority: the brokers and services they start keep the cores they ask for
        _BUILD = subprocess.Popen(["nice", "-n", "10", "make", "--no-print-directory", "-C", str(ROOT), "jaeger"],
                                  stdout=out, stderr=subprocess.STDOUT), log


_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memory
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{grpc}
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Jaeger:
    def __init__(self, otlp: int, query: int) -> None:
        self.traces_url = f"http://127.0.0.1:{otlp}/v1/traces"
        self.query = f"http://127.0.0.1:{query}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.query}/api/services", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def spans(self, trace_id: int) -> list[dict[str, Any]]:
        """Every span Jaeger keeps of the trace, as received (OTLP JSON)."""
        try:
            with urllib.request.urlopen(f"{self.query}/api/v3/traces/{trace_id:032x}?raw_traces=true",
                                        timeout=10) as answer:
                document = json.load(answer)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return []
            raise
        return [span for resource in document["result"]["resourceSpans"] for scope in resource["scopeSpans"]
                for span in scope["spans"]]


@contextmanager
def running_jaeger(folder: Path) -> Iterator[Jaeger]:
    if _BUILD is not None:
        build, log = _BUILD
        try:
            build.wait(_BUILD_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make jaeger did not finish in {_BUILD_DEADLINE_S} s (its log: {log})")
        if not BINARY.is_file():
            pytest.skip(f"make jaeger built no Jaeger: {log.read_text(errors='replace')[-2000:]}")
    if not BINARY.is_file():
        pytest.skip(f"no Jaeger at {BINARY}: `make jaeger` builds it (it needs Go and the Go module proxy)")
    otlp, query, grpc = _free_port(), _free_port(), _free_port()
    config = folder / "jaeger.yaml"
    config.write_text(_CONFIG.format(otlp=otlp, query=query, grpc=grpc))
    log = (folder / "jaeger.log").open("wb")
    with subprocess.Popen([str(BINARY), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT) as child:
        try:
            jaeger = Jaeger(otlp, query)
            wait_for(lambda: jaeger.ready() or child.poll() is not None, 60, "Jaeger to answer")
            assert child.poll() is None, (folder / "jaeger.log").read_text()[-3000:]
            yield jaeger
        finally:
            child.terminate()
            child.wait(30)
            log.close()
