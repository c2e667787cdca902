"""The README's first command, on the session's broker with a smaller fleet."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.kafka


def test_demo_runs_end_to_end_and_everything_agrees(kafka, tmp_path):
    for _ in range(2):  # a reused work folder: each run keeps its own stores
        run = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "demo", "--sessions", "60", "--bootstrap",
                              kafka.bootstrap, "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "everything agrees" in run.stdout
        assert ("findings {'lossless': 1, 'request-mismatch': 1, 'sequence-gap': 1, 'unsupported-format': 1}"
                in run.stdout)
    assert len([run for run in tmp_path.iterdir() if (run / "views.sqlite").exists()]) == 2
