"""The wheel stands on its own: built from the checkout, installed into a
fresh virtualenv outside it with only its declared dependencies, it prints
its version, inspects a corpus log and runs a small demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "corpus" / "dsh-real" / "examples-acp-agent-tests-snapshots-tool-call-turn.jsonl"


def _run(argv: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_wheel_installs_alone_and_runs(kafka, tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", dist, ROOT],
         tmp_path, 300)
    (wheel,) = dist.glob("dsh_pipeline-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path, 120)
    _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel], tmp_path, 600)
    cli = venv / "bin" / "dsh-pipeline"

    import importlib.metadata

    version = _run([cli, "--version"], tmp_path, 60).stdout.strip()
    assert version == f"dsh-pipeline {importlib.metadata.version('dsh-pipeline')}"
    summary = _run([cli, "inspect", LOG], tmp_path, 60).stdout
    assert "events" in summary and "REFUSED" not in summary
    demo = _run([cli, "demo", "--sessions", "30", "--real-agents", "0", "--bootstrap", kafka.bootstrap,
                 "--workdir", tmp_path / "demo"], tmp_path, 600).stdout
    assert "everything agrees" in demo
