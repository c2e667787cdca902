"""The Jaeger that `make jaeger` builds for the export-otel test is the one
tools/jaeger/go.mod pins, every module of it checked against go.sum."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.jaeger import JAEGER_VERSION


def test_the_makefile_builds_the_version_go_mod_requires_with_go_sum_checked():
    go_mod = (ROOT / "tools/jaeger/go.mod").read_text()
    assert re.search(rf"^\s*github\.com/jaegertracing/jaeger {re.escape(JAEGER_VERSION)}\b", go_mod, re.M)
    assert re.search(r"^tool github\.com/jaegertracing/jaeger/cmd/jaeger$", go_mod, re.M)
    go_sum = (ROOT / "tools/jaeger/go.sum").read_text()
    assert f"github.com/jaegertracing/jaeger {JAEGER_VERSION} h1:" in go_sum
    makefile = (ROOT / "Makefile").read_text()
    assert "go build -mod=readonly" in makefile
    # `make test` does not wait for the build: the test session starts `make jaeger` beside the other tests
    assert '"jaeger"]' in (ROOT / "tests/jaeger.py").read_text()
