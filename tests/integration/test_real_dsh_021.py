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
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.v4.wire import messages_body
from tests.conftest import ROOT, canonical

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
