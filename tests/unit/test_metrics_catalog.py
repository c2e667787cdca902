"""The metrics catalog: README, registry and dashboard agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import consumers.archiver  # noqa: F401  (registers its metrics)
import consumers.auditor  # noqa: F401
import consumers.projector  # noqa: F401
import producers.bridge  # noqa: F401
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


def test_readme_lists_every_metric():
    section = (ROOT / "README.md").read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(dsh_[a-z_]+)` \|", section, re.M))
    assert listed == registered()


def test_dashboard_queries_use_existing_metrics():
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/dsh-pipeline.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"dsh_[a-z_]+", target["expr"])}
    catalog = registered()
    histograms = {name for name in catalog if not name.endswith("_total")}
    for name in used:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in catalog or base in histograms, name
    assert {"dsh_consumer_lag_records", "dsh_audit_findings_total", "dsh_tokens_total",
            "dsh_turn_ends_total"} <= used
