"""Alerts reach someone: Debian's Prometheus evaluates the repository's rules
over a target whose audit findings grow, and Debian's Alertmanager, run
with deploy/alertmanager.yml, delivers the firing alert to a webhook."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, start_http_server

from dsh_pipeline.local_resources import free_ports
from tests.prometheus_servers import (ALERTMANAGER, AMTOOL, DEPLOY, PROMETHEUS, alertmanager_config, api,
                                      prometheus_config, ready, require)
from tests.waiting import wait_for


def test_amtool_accepts_the_alertmanager_configuration():
    require(AMTOOL)
    checked = subprocess.run([AMTOOL, "check-config", str(DEPLOY / "alertmanager.yml")], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


class _Webhook(ThreadingHTTPServer):
    """A receiver keeping every notification Alertmanager posts."""

    def __init__(self) -> None:
        self.notifications: list[dict] = []
        super().__init__(("127.0.0.1", 0), _Receive)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/dsh-alerts"

    def firing(self) -> set[str]:
        return {alert["labels"]["alertname"] for notification in list(self.notifications)
                for alert in notification["alerts"] if alert["status"] == "firing"}


class _Receive(BaseHTTPRequestHandler):
    server: _Webhook

    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/dsh-alerts":
            self.server.notifications.append(json.loads(body))
        self.send_response(200 if self.path == "/dsh-alerts" else 404)
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as stream:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stream)


def test_a_firing_alert_is_routed_to_the_webhook(tmp_path):
    require(PROMETHEUS, ALERTMANAGER)
    metrics_port, prometheus_port, alertmanager_port = free_ports(3)
    registry = CollectorRegistry()
    findings = Counter("dsh_audit_findings_total", "audit findings", ["rule"], registry=registry)
    findings.labels("request-mismatch")  # the series exists at 0 first: increase() needs a sample before it grows
    metrics, _ = start_http_server(metrics_port, addr="127.0.0.1", registry=registry)
    webhook = _Webhook()
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    routes = alertmanager_config(tmp_path, webhook.url)
    rules = prometheus_config(tmp_path, [f"127.0.0.1:{metrics_port}"], f"127.0.0.1:{alertmanager_port}")
    processes = [
        _start([ALERTMANAGER, f"--config.file={routes}", f"--storage.path={tmp_path / 'alertmanager'}",
                f"--web.listen-address=127.0.0.1:{alertmanager_port}", "--cluster.listen-address="],
               tmp_path / "alertmanager.log"),
        _start([PROMETHEUS, f"--config.file={rules}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}"], tmp_path / "prometheus.log")]
    try:
        def running() -> bool:
            assert all(process.poll() is None for process in processes), \
                "\n".join(log.read_text()[-1500:] for log in tmp_path.glob("*.log"))
            return True

        wait_for(lambda: running() and ready(prometheus_port) and ready(alertmanager_port), 60,
                 "Prometheus and Alertmanager ready")
        wait_for(lambda: running() and any(s["value"][1] == "0" for s in api(
            prometheus_port, "query", query="dsh_audit_findings_total")["data"]["result"]), 60,
                 "the findings counter scraped at 0")
        assert webhook.firing() == set()
        findings.labels("request-mismatch").inc()
        wait_for(lambda: running() and "DshAuditFindings" in webhook.firing(), 90,
                 "the DshAuditFindings alert at the webhook")
        alert = next(alert for notification in webhook.notifications for alert in notification["alerts"]
                     if alert["labels"]["alertname"] == "DshAuditFindings")
        assert alert["labels"]["rule"] == "request-mismatch"
        assert alert["annotations"]["summary"] == "audit findings of rule request-mismatch in the last 15 minutes"
        assert webhook.firing() == {"DshAuditFindings"}  # nothing else of the rules fired on this target
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        for server in (webhook, metrics):
            server.shutdown()
            server.server_close()
