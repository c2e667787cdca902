"""Real dsh 0.2.1rc2 agents, run now: their v4 logs read as dsh reads them
and every agent request they sent rebuilt from the log.

The pinned runtime wheel runs nine headless agents against the scripted
Messages endpoint (``tests/fixtures/dsh-0.2.1/generate.py --out``: tools,
parallel tools, a retried 500, a mid-stream error, max-tokens, a second
turn in a new process, tool errors, a compaction). Each log must be
accepted, and the body dsh POSTed for each agent request (less
``dsh_session_log`` and ``dsh_plugin_packages``) must equal the Messages
body rebuilt in front of its ``assistant/message`` or ``assistant/attempt``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.migration.migrate import migrate
from dsh_core.formats.v4.wire import messages_body
from dsh_pipeline.dsh_runtimes import runtime_executable
from tests.conftest import ROOT, canonical
from tests.oracle import place_log
from tests.scripted_messages import ScriptedMessages

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                                reason="the dsh runtime wheel is linux x86_64 only")

GENERATOR = ROOT / "tests" / "fixtures" / "dsh-0.2.1" / "generate.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dsh-0.2.1")
    done = subprocess.run([sys.executable, str(GENERATOR), "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_every_real_agent_log_is_accepted_and_every_request_rebuilt(runs):
    logs = sorted(runs.glob("*.v4.jsonl.zstd"))
    assert len(logs) >= 8
    compared = 0
    for log in logs:
        report = inspect_path(log).to_json()
        assert report["accepted"], (log.name, report["error"])
        sent = [request for request in json.loads(log.with_name(log.name.split(".v")[0] + ".requests.json").read_text())
                if request["kind"] == "agent"]
        rebuilt = [messages_body(request["header"], request["context"], request["messages"])
                   for request in report["requests"]]
        assert len(rebuilt) == len(sent), log.name
        for body, request in zip(rebuilt, sent):
            assert canonical(body) == canonical(request["body"]), (log.name, request["status"])
            compared += 1
    assert compared >= 17


@pytest.mark.parametrize("release, pattern", [("0.1.5", "*.v3.jsonl.zstd"), ("0.1.2", "*.jsonl.zstd")],
                         ids=["v3", "v0"])
def test_a_migrated_session_is_continued_by_the_real_0_2_1_agent(tmp_path, release, pattern):
    """Logs dsh 0.1.5 (v3) and 0.1.2 (v0) wrote, migrated by ``dsh-pipeline
    migrate``: the 0.2.1rc2 binary (which cannot migrate them itself)
    continues each to a completed turn, and what it sends is what the
    migrated log rebuilds to."""
    exe = runtime_executable("0.2.1rc2")
    sessions = tmp_path / "home" / "sessions"
    continued = 0
    logs = sorted((ROOT / "tests" / "fixtures" / f"dsh-{release}").glob(pattern))
    with ScriptedMessages() as model:
        for log in [log for log in logs if any(name in log.name for name in ("plain", "tools", "compact"))]:
            session_id = place_log(log, sessions)
            folder = next(sessions.glob(f"*/{session_id}"))
            migrated = migrate(folder)
            cwd = Path(inspect_path(migrated).to_json()["sessionHeader"]["cwd"])
            cwd.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "DEEPSEEK_BASE_URL": model.url,
                   "DEEPSEEK_API_KEY": "scripted-key", "DSH_TELEMETRY_DISABLED": "1",
                   "DSH_PERMISSION_MODE": "danger-full-access"}
            done = subprocess.run([str(exe), "--profile", "headless", "--json", "--session-id", session_id,
                                   "Continue. [script:plain]"], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=120, check=False)
            assert done.returncode == 0, (log.name, done.stderr[-1500:] or done.stdout[-1500:])
            report = inspect_path(migrated).to_json()
            assert report["accepted"], report["error"]
            assert report["turns"][-1]["reason"] == {"kind": "completed"}
            sent = [request for request in model.requests_of(session_id) if request.kind == "agent"]
            body = messages_body(report["requests"][-1]["header"], report["requests"][-1]["context"],
                                 report["requests"][-1]["messages"])
            expected = {key: value for key, value in sent[-1].body.items()
                        if key not in ("dsh_session_log", "dsh_plugin_packages")}
            assert canonical(body) == canonical(expected), (log.name, _differences(body, expected))
            continued += 1
    assert continued == 3


def _differences(ours: dict, sent: dict) -> list[str]:
    """Which top-level fields, and which messages, differ (for a failure message)."""
    out = [key for key in sorted(set(ours) | set(sent)) if key != "messages" and canonical(ours.get(key)) != canonical(sent.get(key))]
    rebuilt, wire = ours.get("messages", []), sent.get("messages", [])
    if len(rebuilt) != len(wire):
        out.append(f"{len(rebuilt)} messages rebuilt, {len(wire)} sent: "
                   f"{[(m['role'], canonical(m['content'])[:120]) for m in rebuilt]} vs "
                   f"{[(m['role'], canonical(m['content'])[:120]) for m in wire]}")
    out += [f"message {index}: {canonical(a)[:300]} != {canonical(b)[:300]}"
            for index, (a, b) in enumerate(zip(rebuilt, wire)) if canonical(a) != canonical(b)]
    return out
