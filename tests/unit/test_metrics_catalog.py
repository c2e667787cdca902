"""The metrics catalog: the metrics reference page, registry and dashboard agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import consumers.archiver  # noqa: F401  (registers its metrics)
import consumers.auditor  # noqa: F401
import consumers.otel  # noqa: F401
import consumers.projector  # noqa: F401
import consumers.projector.outcomes  # noqa: F401
import producers.bridge  # noqa: F401
import producers.gateway  # noqa: F401
import producers.publisher  # noqa: F401
import producers.shipper  # noqa: F401
from prometheus_client import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def registered() -> set[str]:
    names = set()
    for metric in REGISTRY.collect():
        if metric.name.startswith("dsh_"):
            names.add(metric.name + "_total" if metric.type == "counter" else metric.name)
    return names


def unknown(used: set[str]) -> set[str]:
    """The names of ``used`` that are neither a metric of the catalog nor a
    series of one of its histograms (``_bucket``, ``_sum``, ``_count``)."""
    catalog = registered()
    histograms = {name for name in catalog if not name.endswith("_total")}
    return {name for name in used
            if name not in catalog and re.sub(r"_(bucket|sum|count)$", "", name) not in histograms}


def test_the_reference_lists_every_metric():
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(dsh_[a-z0-9_]+)` \|", page, re.M))
    assert listed == registered()


def test_dashboard_queries_use_existing_metrics():
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/dsh-pipeline.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"dsh_[a-z0-9_]+", target["expr"])}
    assert not unknown(used), unknown(used)
    assert {"dsh_consumer_lag_records", "dsh_audit_findings_total", "dsh_tokens_total",
            "dsh_turn_ends_total"} <= used


def test_dashboard_panels_follow_the_range_and_say_what_they_show():
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/dsh-pipeline.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            windows = re.findall(r"\[([^\]]+)\]", target["expr"])
            expected = "$__range" if panel["type"] in ("stat", "piechart") else "$__rate_interval"
            assert set(windows) <= {expected}, (panel["title"], target["expr"])
            assert "legendFormat" in target, panel["title"]
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Shipper refusals by error", "Publisher errors by class"} <= titles


def test_alert_rules_use_existing_metrics():
    rules = (ROOT / "deploy/prometheus-rules.yml").read_text()
    used = set(re.findall(r"dsh_[a-z0-9_]+", rules)) - {"dsh_pipeline"}
    assert used and not unknown(used), unknown(used)
    assert "dsh_gateway_upstream_first_byte_seconds_bucket" in used
