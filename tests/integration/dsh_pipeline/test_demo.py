"""The README's first command, on the session's broker with a smaller fleet
(and, where the dsh 0.1.1rc1 runtime is installed, eight real agents beside
it in the first run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_pipeline.demo_agents import runtime_problem

pytestmark = pytest.mark.kafka

REAL_AGENTS_LINE = re.compile(r"  real agents 8 \(0\.1\.1rc1 via the gateway\): (\d+) requests verified, 0 mismatch, "
                              r"0 unlogged, 0 unattested \(the model answered (\d+)\)\n")


def test_demo_runs_end_to_end_and_everything_agrees(kafka, tmp_path):
    problem = runtime_problem()
    # first run: eight real agents where the runtime is installed, else the default (which skips them, saying why)
    for real_agents in (["--real-agents", "8"] if problem is None else [], ["--real-agents", "0"]):
        run = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "demo", "--sessions", "60", "--bootstrap",
                              kafka.bootstrap, "--workdir", str(tmp_path), *real_agents],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "everything agrees" in run.stdout
        assert ("findings {'lossless': 1, 'request-mismatch': 1, 'sequence-gap': 1, 'unsupported-format': 1}"
                in run.stdout)
        line = REAL_AGENTS_LINE.search(run.stdout)
        if real_agents == ["--real-agents", "8"]:
            assert line is not None, run.stdout[-3000:]
            assert line.groups() == ("16", "16")  # every request the model answered, verified against its log
        else:
            assert line is None and "real agents 0" not in run.stdout
            assert ("real agents skipped: " in run.stdout) == (not real_agents), run.stdout[:1000]
    assert len([run for run in tmp_path.iterdir() if (run / "views.sqlite").exists()]) == 2


def test_real_agents_without_the_runtime_are_skipped_by_default_and_refused_when_asked_for(tmp_path):
    hidden = ("import sys; sys.modules['deepseek_harness_runtime'] = None; from dsh_pipeline.demo_agents import "
              "default_real_agents; print(default_real_agents()); from dsh_pipeline.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", hidden, "demo", "--real-agents", "3", "--bootstrap", "127.0.0.1:1",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines() == ["real agents skipped: the dsh runtime is not installed: pip install "
                                       "'deepseek-harness-runtime-bin==0.1.1rc1'", "0"], run.stdout
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines() == ["dsh-pipeline demo: PipelineError: --real-agents 3: the dsh runtime is not "
                                       "installed: pip install 'deepseek-harness-runtime-bin==0.1.1rc1' "
                                       "(--real-agents 0 runs without them)"]
    assert not list(tmp_path.iterdir())  # refused before anything started


@pytest.fixture
def busy_cores():
    """Two busy loops at normal priority, as a laptop's other processes would keep both cores busy."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


def test_the_demo_passes_while_other_processes_keep_both_cores_busy(kafka, tmp_path, busy_cores):
    run = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "demo", "--sessions", "60", "--real-agents", "0",
                          "--bootstrap", kafka.bootstrap, "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert "everything agrees" in run.stdout


def test_a_failed_demo_keeps_its_work_folder_and_shows_what_each_process_said(kafka, tmp_path, monkeypatch, capsys):
    import tempfile

    from dsh_pipeline import demo

    def cli(*args: str) -> list[str]:  # a projector that cannot start
        if args[0] == "project":
            return [sys.executable, "-c", "import sys; sys.exit('projector: the view store is unusable')"]
        return [sys.executable, "-m", "dsh_pipeline.cli", *args]

    monkeypatch.setattr(demo, "_cli", cli)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the demo's own work folder goes
    with pytest.raises(demo.PipelineError, match=r"a service exited early \(code 1\); see .*/logs"):
        demo.run_demo(demo.DemoConfig(sessions=5, bootstrap=kafka.bootstrap))
    err = capsys.readouterr().err
    kept = re.search(r"the demo failed; its work folder is kept: (\S+)\n", err)
    assert kept is not None and Path(kept.group(1)).is_dir(), err
    assert f"--- projector, the last 1 lines of {kept.group(1)}/logs/projector.log:\n  projector: the view store is " \
           "unusable\n" in err
    assert f"--- auditor, the last " in err and f"--- simulator, the last " in err
