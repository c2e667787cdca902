"""Debian's Prometheus, promtool and Alertmanager for the tests, run over
the repository's own deploy/ configuration with the targets, receiver and
rhythm a test needs (each replacement asserts the text it replaces is still
there, so the deployment and the tests cannot drift apart)."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
ALERTMANAGER, AMTOOL = shutil.which("prometheus-alertmanager"), shutil.which("amtool")


def require(*binaries: str | None) -> None:
    """Skip, saying why, unless every binary is installed."""
    if not all(binaries):
        pytest.skip("prometheus, promtool and prometheus-alertmanager are not all installed: `make test` installs "
                    "Debian's packages (apt-get, as root); it could not on this machine")


def _replaced(text: str, source: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert old in text, f"{source} no longer holds {old!r}"
        text = text.replace(old, new)
    return text


def prometheus_config(folder: Path, targets: list[str], alertmanager: str | None = None) -> Path:
    """deploy/prometheus.yml with the repository's rules, these targets, a 1 s
    rhythm and (given) this Alertmanager."""
    text = _replaced((DEPLOY / "prometheus.yml").read_text(), "deploy/prometheus.yml",
                     ("/etc/prometheus/rules.yml", str(DEPLOY / "prometheus-rules.yml")),
                     ('["shipper:9100", "projector:9100", "auditor:9100", "archiver:9100", "gateway:9100"]',
                      json.dumps(targets)),
                     ('["alertmanager:9093"]', json.dumps([alertmanager or "127.0.0.1:1"])),
                     ("scrape_interval: 5s", "scrape_interval: 1s"),
                     ("evaluation_interval: 15s", "evaluation_interval: 1s"))
    path = folder / "prometheus.yml"
    path.write_text(text)
    return path


def alertmanager_config(folder: Path, webhook: str) -> Path:
    """deploy/alertmanager.yml sending to ``webhook`` without waiting to group."""
    text = _replaced((DEPLOY / "alertmanager.yml").read_text(), "deploy/alertmanager.yml",
                     ("http://alert-webhook:8080/dsh-alerts", webhook), ("group_wait: 30s", "group_wait: 0s"))
    path = folder / "alertmanager.yml"
    path.write_text(text)
    return path


def api(port: int, path: str, **query: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def ready(port: int) -> bool:
    """Whether the Prometheus or Alertmanager on ``port`` says it is ready."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
