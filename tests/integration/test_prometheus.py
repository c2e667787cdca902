"""Real Prometheus (Debian's package, which ``make test`` installs) over the
project's own configuration, rules and dashboard: promtool accepts them,
Prometheus scrapes the shipper, projector, auditor, archiver and gateway on
the real broker, every dashboard query returns series, and an alert fires when its
condition is made true (records dead-lettered)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dsh_kafka.clients import make_producer
from dsh_kafka.config import SERVICE_PRODUCER
from dsh_pipeline.local_resources import free_ports
from tests.conftest import corpus_logs, expected_of
from tests.layout_helpers import place
from tests.prometheus_servers import DEPLOY, PROMETHEUS, PROMTOOL, api, prometheus_config, ready, require
from tests.wire_upstream import WireUpstream

pytestmark = pytest.mark.kafka

#: Dashboard queries a run without publisher failures leaves empty (the series appears with the first error).
EMPTY_WITHOUT_FAILURES = {"sum by (error) (increase(dsh_publisher_errors_total[1m]))"}


@pytest.fixture(scope="module")
def tools() -> tuple[str, str]:
    require(PROMETHEUS, PROMTOOL)
    return PROMETHEUS, PROMTOOL


def test_promtool_accepts_the_configuration_and_the_rules(tools, tmp_path):
    _, promtool = tools
    rules = subprocess.run([promtool, "check", "rules", str(DEPLOY / "prometheus-rules.yml")], capture_output=True,
                           text=True, check=False)
    assert rules.returncode == 0 and "SUCCESS: 9 rules found" in rules.stdout, rules.stdout + rules.stderr
    config = subprocess.run([promtool, "check", "config", str(prometheus_config(tmp_path, ["127.0.0.1:9100"]))],
                            capture_output=True, text=True, check=False)
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_rules_fire_on_the_series_they_are_meant_for_and_only_then(tools):
    _, promtool = tools
    tested = subprocess.run([promtool, "test", "rules", str(DEPLOY / "prometheus-rules.test.yml")],
                            capture_output=True, text=True, check=False)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "dsh-pipeline.json").read_text())
    return [target["expr"].replace("$__rate_interval", "1m").replace("$__range", "5m")
            for panel in dashboard["panels"] for target in panel.get("targets", [])]


def _headers(seq: int) -> list[tuple[str, bytes]]:
    return [("dsh-kind", b"record"), ("dsh-seq", str(seq).encode()), ("dsh-count", b"1"), ("dsh-format", b"0")]


def test_prometheus_scrapes_every_service_and_an_alert_fires(tools, kafka, topics, tmp_path):
    prometheus, _ = tools
    names = topics(partitions=2)
    prefix = names.events[: -len("dsh.session-events")]
    root = tmp_path / "sessions"
    for log in [log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"]][:8]:
        place(root, log.read_bytes(), "zstd")
    broken = root / "--work--" / "broken-session" / "session.jsonl"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b'{"type": "session", "version": 0}\n')  # no id: the shipper refuses it (an error series)
    ports = free_ports(7)
    upstream = WireUpstream().__enter__()  # a model endpoint for the gateway
    common = ["--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "2"]
    commands = {"ship": ["ship", "--root", str(root)],
                "project": ["project", "--store", str(tmp_path / "views.sqlite")],
                "audit": ["audit", "--state", str(tmp_path / "audit.sqlite")],
                "archive": ["archive", "--root", str(tmp_path / "archive")],
                "gateway": ["gateway", "--listen", f"127.0.0.1:{ports[6]}", "--upstream", upstream.url,
                            "--credentials-file", str(_credentials(tmp_path))]}
    def start(name: str, argv: list[str]) -> subprocess.Popen:
        with open(tmp_path / f"{name}.log", "wb") as log:
            return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)

    processes = [start(name, [sys.executable, "-m", "dsh_pipeline.cli", *args, *common, "--metrics-port", str(port)])
                 for (name, args), port in zip(commands.items(), ports)]
    targets = [f"127.0.0.1:{port}" for port in ports[:5]]
    processes.append(start("prometheus", [prometheus, f"--config.file={prometheus_config(tmp_path, targets)}",
                                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{ports[5]}"]))
    try:
        deadline = time.monotonic() + 180
        dead_letters, scraped_at_send = 0, -1
        queries = _dashboard_queries()
        while not ready(ports[5]):
            assert time.monotonic() < deadline and processes[-1].poll() is None, \
                (tmp_path / "prometheus.log").read_text()[-1500:]
            time.sleep(0.2)  # wait-ok: Prometheus starting, with a deadline
        simulated = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "6",
                                    "--format", "0,3,4", "--fault-unknown", "1", *common], capture_output=True,
                                   text=True, timeout=120, check=False)  # attested requests, a refused session
        assert simulated.returncode == 0, simulated.stderr[-1500:]
        for system in ("Be brief.", "Create a concise title for this conversation."):  # an agent step, a title
            _through_gateway(ports[6], system, deadline)
        while True:
            assert time.monotonic() < deadline, (f"not every query has series, or no alert fired: "
                                                 f"{[q for q in queries if not _series(ports[5], q)]} "
                                                 f"{api(ports[5], 'alerts')['data']['alerts']}")
            assert all(process.poll() is None for process in processes), "a process of the run stopped"
            scraped = _scraped_dead_letters(ports[5])
            if _up(ports[5]) == 5 and dead_letters < 2 and scraped > scraped_at_send:
                dead_letters += 1  # one after another is seen: increase() needs the counter seen before it grows
                scraped_at_send = scraped
                asyncio.run(_dead_letter(kafka, names.events, dead_letters))
            firing = [alert["labels"]["alertname"] for alert in api(ports[5], "alerts")["data"]["alerts"]
                      if alert["state"] == "firing"]
            empty = [q for q in queries if q not in EMPTY_WITHOUT_FAILURES and not _series(ports[5], q)]
            if "DshRecordsDeadLettered" in firing and not empty:
                break
            time.sleep(0.5)  # wait-ok: polling Prometheus with a deadline
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        upstream.__exit__(None, None, None)


FLEET = "fleet-scraped-4e7a1c90b3"


def _credentials(folder: Path) -> Path:
    path = folder / "gateway-credentials"
    path.touch(0o600)
    path.write_text(f"prometheus-test {FLEET}\n")
    return path


def _through_gateway(port: int, system: str, deadline: float) -> None:
    """One Messages request through the gateway, once it listens."""
    body = json.dumps({"model": "m", "system": system, "messages": [{"role": "user", "content": "hi"}]}).encode()
    while True:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/messages", data=body, headers={
            "content-type": "application/json", "x-deepseek-harness-session-id": "scraped-session",
            "x-dsh-gateway-credential": FLEET})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
                return
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, "the gateway never answered"
            time.sleep(0.2)  # wait-ok: the gateway starting, with a deadline


def _series(port: int, query: str) -> list:
    answer = api(port, "query", query=query)
    assert answer["status"] == "success", (query, answer)
    return answer["data"]["result"]


def _up(port: int) -> int:
    return sum(1 for series in _series(port, 'up{job="dsh-pipeline"}') if series["value"][1] == "1")


def _scraped_dead_letters(port: int) -> int:
    """The dead letters Prometheus has seen the projector send."""
    series = _series(port, 'sum(dsh_consumer_dead_letters_total{service="projector"})')
    return int(float(series[0]["value"][1])) if series else 0


async def _dead_letter(kafka, topic: str, number: int) -> None:
    """A record every consumer dead-letters (its seq is no safe integer)."""
    producer = make_producer(kafka, SERVICE_PRODUCER)
    await producer.start()
    try:
        await producer.send_and_wait(topic, key=f"hostile-{number}".encode(), value=b"{}", headers=_headers(2**63))
    finally:
        await producer.stop()
