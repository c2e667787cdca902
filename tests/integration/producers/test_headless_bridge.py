"""Real dsh 0.2.1rc2 headless agents behind the worker bridge, on the real
broker: every event dsh wrote reaches Kafka as the file holds it (the final
answer, ``step/end`` and ``turn/end`` included), projector, auditor and
archiver take the sessions as dsh reads them, and every agent request the
scripted model received is rebuilt from the archived log.

The scenarios are the fixture generator's (``tests/fixtures/dsh-0.2.1/generate.py``):
tools, parallel tools, a retried 500, a broken stream, max-tokens, a second
turn in a new process, tool errors, a compaction.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections import defaultdict

import pytest

from consumers.projector import ViewStore
from producers.errors import RuntimeDiedError
from dsh_core.inspect import inspect_path
from dsh_core.jsonvalue import thaw
from dsh_core.loader import load_session
from dsh_core.formats.v4.wire import messages_body
from dsh_kafka.config import Secret
from dsh_pipeline.dsh_runtimes import runtime_executable
from producers.asgi_server import AsgiServer
from producers.gateway import Gateway, GatewayConfig
from producers.gateway_admission import Credentials
from producers.headless import HeadlessBridge, HeadlessConfig
from producers.publisher import Publisher
from tests.conftest import ROOT, canonical
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import caught_up, consume_all, end_offsets
from tests.scripted_messages import ScriptedMessages
from tests.services import archiver, auditor, projector, wire_verdicts
from tests.unit.dsh_core.test_fold_snapshot_v4 import stored_lines

pytestmark = [pytest.mark.kafka, pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                                                    reason="the dsh runtime wheel is linux x86_64 only")]


FLEET = "fleet-headless-6a2f9c1e"  # the agents' credential: the gateway sends the model its own key


def _scenarios():
    spec = importlib.util.spec_from_file_location("dsh_021_generate", ROOT / "tests" / "fixtures" / "dsh-0.2.1" /
                                                  "generate.py")
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module.SCENARIOS


class _Watched:
    """The publisher, noting for each record whether its runtime was running."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher, self.bridge, self.live = publisher, None, 0

    async def send(self, record) -> None:
        self.live += self.bridge.pid is not None
        await self.publisher.send(record)

    async def flush(self) -> None:
        await self.publisher.flush()


def test_headless_agents_are_published_live_as_dsh_wrote_them(kafka, topics, group_id, tmp_path):
    names = topics(partitions=3)
    archive, home = tmp_path / "archive", tmp_path / "home"
    scenarios = _scenarios()
    assert len(scenarios) >= 8
    ended: dict[str, list] = {}

    async def run(model: ScriptedMessages) -> tuple[list, list, int]:
        async with Publisher(kafka, names) as publisher, \
                AsgiServer(Gateway(GatewayConfig(upstream=model.url, credentials=Credentials({"agents": Secret(FLEET)}),
                                                 upstream_key=Secret("scripted-key")), publisher.send),
                           "the gateway") as gateway:
            config = HeadlessConfig(executable=runtime_executable("0.2.1rc2"), workspace=tmp_path / "work",
                                    home=home, model_url=gateway.url, api_key=Secret(FLEET))
            watched = _Watched(publisher)
            async with HeadlessBridge(config, watched) as bridge:
                watched.bridge = bridge
                for scenario in scenarios:
                    session_id = None
                    for index, task in enumerate(scenario.tasks):
                        result = await bridge.prompt(session_id, f"{task} [script:{scenario.script}]" if index == 0
                                                     else task)
                        session_id = result.session_id
                        ended.setdefault(session_id, []).append(result.end_reason["kind"])
        ends = await end_offsets(kafka, names.events)
        services = [projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite", hot_sessions=2),
                    auditor(kafka, names, group_id("auditor"), hot_sessions=2, require_gateway=True),
                    archiver(kafka, names, group_id("archiver"), archive, hot_sessions=2)]
        await asyncio.gather(*(run_until(service, lambda s=service: caught_up(s, ends)) for service in services))
        events = await consume_all(kafka, names.events, sum(ends.values()), timeout=10)
        findings = await consume_all(kafka, names.findings, 10_000, timeout=3, committed_only=True)
        return events, findings, watched.live

    verdicts_before = wire_verdicts()
    with ScriptedMessages() as model:
        events, findings, live = asyncio.run(run(model))
        requests = {session_id: [r.body for r in model.requests_of(session_id) if r.kind == "agent"]
                    for session_id in ended}
        served = collections.Counter(request.kind for request in model.requests)
    verdicts = wire_verdicts() - verdicts_before

    assert len(ended) == len(scenarios)
    assert sorted(map(tuple, ended.values())) == sorted(
        ("max-tokens",) if s.name == "max-tokens" else ("completed",) * len(s.tasks) for s in scenarios)
    assert [json.loads(r.value)["rule"] for r in findings] == [], [json.loads(r.value)["detail"] for r in findings]
    # every request went through the gateway: each agent step verified against its boundary in the log, titles
    # and compactions classified (a test of the gateway's own matching needs the counts to be exact)
    assert verdicts == {("messages", "agent", "verified"): served["agent"],
                        ("messages", "title", "classified"): served["title"],
                        ("messages", "compaction", "classified"): served["compaction"]}, (verdicts, served)
    assert served["agent"] >= 17 and served["title"] >= 8 and served["compaction"] >= 1
    assert live > 0, "no record was published while its runtime ran"
    published = defaultdict(list)
    for record in events:
        if dict(record.headers)["dsh-kind"] != b"wire-attestation":
            assert dict(record.headers)["dsh-format"] == b"4"
            published[record.key.decode()].append(record.value)
    store = ViewStore(tmp_path / "views.sqlite")
    try:
        compared = 0
        for session_id in ended:
            [log] = home.glob(f"sessions/*/{session_id}/session.v4.jsonl.zstd")
            lines = stored_lines(log)
            assert published[session_id] == lines, session_id  # Kafka holds the file, record for record
            assert [json.loads(line)["type"] for line in lines[1:]].count("turn/end") == len(ended[session_id])
            view = store.view(session_id)
            assert view["status"] == "idle" and view["nextSeq"] == len(lines) - 1, (session_id, view)
            assert canonical(thaw(store.fold(session_id).state.messages())) == canonical(
                thaw(load_session(log).state.messages())), session_id
            [archived] = archive.glob(f"*/{session_id}/session*.jsonl.zstd")
            assert archived.name == "session.v4.jsonl.zstd" and stored_lines(archived) == lines, session_id
            report = inspect_path(archived).to_json()
            rebuilt = [messages_body(r["header"], r["context"], r["messages"]) for r in report["requests"]]
            sent = [{k: v for k, v in body.items() if k not in ("dsh_session_log", "dsh_plugin_packages")}
                    for body in requests[session_id]]
            assert len(rebuilt) == len(sent) and canonical(rebuilt) == canonical(sent), session_id
            compared += len(sent)
    finally:
        store.close()
    assert compared >= 17


def test_a_runtime_that_ends_no_turn_is_named_with_its_own_words(kafka, topics, tmp_path):
    names = topics(partitions=1)

    async def run() -> None:
        with ScriptedMessages() as model:
            config = HeadlessConfig(executable=runtime_executable("0.2.1rc2"), workspace=tmp_path / "work",
                                    home=tmp_path / "home", model_url=model.url, api_key=Secret("scripted-key"))
            async with Publisher(kafka, names) as publisher, HeadlessBridge(config, publisher) as bridge:
                await bridge.prompt("session-never-made", "Go on.")

    with pytest.raises(RuntimeDiedError, match='exited 1 without ending its turn: .*session "session-never-made" does '
                                               "not exist; omit --session-id"):
        asyncio.run(run())


def test_the_worker_command_runs_headless_turns_of_one_session(kafka, topics, tmp_path):
    """``dsh-pipeline worker --runtime headless``: the first prompt starts a
    session, the next continues it in a new process; Kafka holds the file."""
    names = topics(partitions=1)
    prefix = names.events[: -len("dsh.session-events")]
    with ScriptedMessages() as model:
        done = subprocess.run(
            [sys.executable, "-m", "dsh_pipeline.cli", "worker", "--runtime", "headless", "--prompt",
             "First question. [script:two-turns]", "--prompt", "Second question.", "--workspace",
             str(tmp_path / "work"), "--home", str(tmp_path / "home"), "--model-url", model.url, "--bootstrap",
             kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "1", "--no-create-topics"],
            env={**os.environ, "DEEPSEEK_API_KEY": "scripted-key"}, capture_output=True, text=True, timeout=300,
            check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout.splitlines()
    assert len(said) == 2 and all("turn ended {'kind': 'completed'}" in line for line in said), said
    session_id = said[0].split()[1].rstrip(":")
    assert said[1].startswith(f"session {session_id}:")
    [log] = (tmp_path / "home").glob(f"sessions/*/{session_id}/session.v4.jsonl.zstd")
    lines = stored_lines(log)
    agent_requests = sum(1 for request in model.requests if request.kind == "agent")
    published = asyncio.run(consume_all(kafka, names.events, len(lines) + len(model.requests), timeout=30))
    assert [r.value for r in published if dict(r.headers)["dsh-kind"] != b"wire-attestation"] == lines
    attested = [json.loads(r.value) for r in published if dict(r.headers)["dsh-kind"] == b"wire-attestation"]
    assert len(attested) == len(model.requests) and sum(a["kind"] == "agent" for a in attested) == agent_requests
