"""Real dsh agents (the JSON-RPC runtime) through the worker bridge into Kafka."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import platform
import signal
import sys
import time

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_kafka.config import Secret
from dsh_kafka.records import decode_kafka_record
from dsh_core.loader import load_session, read_events
from dsh_core.storage.records import decode_row
from dsh_core.jsonvalue import decode_json
from producers.errors import RuntimeDiedError
from producers.bridge import RuntimeConfig, WorkerBridge, find_runtime
from producers.publisher import Publisher
from dsh_core.storage.layout import find_session_files
from tests.conftest import canonical
from consumers.projector import ViewStore
from dsh_kafka.admin import end_offsets
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import caught_up, consume_all
from tests.services import archiver, auditor, projector
from tests.scripted_model import ScriptedModel

pytestmark = [pytest.mark.kafka, pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="the dsh runtime wheel is linux x86_64 only")]

SCENARIOS = {"plain": 1, "tools": 1, "parallel": 1, "retry": 1, "max-tokens": 1, "two-turns": 2}


def _events_of(records) -> dict[str, list]:
    """Logical events per session from consumed records (rows expanded)."""
    out: dict[str, list] = collections.defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        decoded = decode_kafka_record(record)
        if decoded.kind != "record":
            continue
        value = decode_json(decoded.value)
        out[decoded.session_id].extend(decode_row(value).expand() if value["type"].endswith("-chunks") else [value])
    return out


def test_real_agents_publish_their_session_files_event_for_event(kafka, topics, tmp_path):
    names = topics(partitions=6)
    executable, cordis = find_runtime()
    root = tmp_path / "sessions"
    results = {}

    async def run_fleet(model_url: str) -> None:
        async with Publisher(kafka, names) as publisher:
            async def agent(name: str, turns: int) -> None:
                config = RuntimeConfig(executable=executable, cordis_config=cordis,
                                       workspace=tmp_path / f"ws-{name}", session_root=root,
                                       home=tmp_path / f"home-{name}", model_url=model_url, api_key=Secret("test-key"))
                async with WorkerBridge(config, publisher) as bridge:
                    session_id = f"real-{name}"
                    for turn in range(turns):
                        results[(name, turn)] = await bridge.prompt(session_id, f"[script:{name}#{name}] turn {turn + 1}: go")
            await asyncio.gather(*(agent(name, turns) for name, turns in SCENARIOS.items()))

    with ScriptedModel() as model:
        asyncio.run(asyncio.wait_for(run_fleet(model.url), 120))
        served = collections.Counter()
        for body in model.requests:
            first = next(m for m in body["messages"] if m["role"] == "user")
            served[json.dumps(first["content"]).split("#")[1].split("]")[0]] += 1

    assert {name for name, _ in results} == set(SCENARIOS)
    files = {path.parent.name: path for path in find_session_files(root)}
    assert len(files) == len(SCENARIOS)
    expected_records = sum(1 + len(read_events(path)[1]) for path in files.values())
    live = asyncio.run(consume_all(kafka, names.events, expected_records, timeout=60))
    live_events = _events_of(live)
    headers = {decode_kafka_record(r).session_id: decode_kafka_record(r).value for r in live
               if decode_kafka_record(r).kind == "header"}
    for name in SCENARIOS:
        session_id = f"real-{name}"
        header, stored = read_events(files[session_id])
        assert canonical(live_events[session_id]) == canonical(stored), f"{name}: Kafka differs from dsh's file"
        assert headers[session_id] == header.to_line()
        analysis = LogAnalysis(keep_requests=False)
        loaded = load_session(files[session_id], observer=analysis)
        assert loaded.accepted, loaded.error
        # every request the model saw is a request boundary of the log (dsh logs
        # a failed attempt as an error finish chunk, so the 500 counts too)
        assert analysis.request_count == served[name], name
    ends = {name: results[(name, SCENARIOS[name] - 1)].end_reason["kind"] for name in SCENARIOS}
    assert ends["max-tokens"] == "max-tokens" and ends["plain"] == "completed"

    # the same sessions shipped from disk by the shipper give the same stream
    shipped_names = topics(partitions=6)
    from dsh_kafka.admin import cluster_id
    from producers.shipper import Destination, Shipper, ShipperConfig

    async def ship() -> int:
        async with Publisher(kafka, shipped_names) as publisher:
            shipper = Shipper(ShipperConfig(root=root, state_dir=tmp_path / "state", once=True), publisher.send,
                              publisher.flush, report=lambda line: pytest.fail(line), say=print,
                              destination=Destination(await cluster_id(kafka), shipped_names.events))
            return (await shipper.ship_once()).records

    sent = asyncio.run(ship())
    shipped = _events_of(asyncio.run(consume_all(kafka, shipped_names.events, sent, timeout=30)))
    assert canonical(shipped) == canonical(live_events)
    _the_shipper_completes_what_the_bridges_published(kafka, names, root, files, tmp_path)


def _the_shipper_completes_what_the_bridges_published(kafka, names, root, files, tmp_path) -> None:
    """The deployment where bridges publish live and the shipper ships the same
    session files to the same topic (completing what a bridge missed). The
    services take the shipper's records, packed otherwise than the bridges'
    one-event records, as duplicates: no dead letter, views and archives
    exactly the files."""
    from dsh_kafka.admin import cluster_id
    from producers.shipper import Destination, Shipper, ShipperConfig

    async def scenario() -> list:
        async with Publisher(kafka, names) as publisher:
            shipper = Shipper(ShipperConfig(root=root, state_dir=tmp_path / "same-topic", once=True), publisher.send,
                              publisher.flush, report=lambda line: pytest.fail(line), say=print,
                              destination=Destination(await cluster_id(kafka), names.events))
            await shipper.ship_once()
        ends = await end_offsets(kafka, names.events)
        services = [projector(kafka, names, "bridged-p", tmp_path / "views.sqlite"),
                    auditor(kafka, names, "bridged-au"), archiver(kafka, names, "bridged-ar", tmp_path / "archive")]
        await asyncio.gather(*(run_until(service, lambda s=service: caught_up(s, ends)) for service in services))
        return await consume_all(kafka, names.dead_letter, 1, timeout=3)

    assert asyncio.run(scenario()) == []
    store = ViewStore(tmp_path / "views.sqlite")
    try:
        for session_id, path in files.items():
            assert store.view(session_id)["nextSeq"] == len(read_events(path)[1]), session_id
    finally:
        store.close()
    archived = {path.parent.name: path for path in find_session_files(tmp_path / "archive")}
    assert {s: canonical(read_events(p)[1]) for s, p in archived.items()} == {
        s: canonical(read_events(p)[1]) for s, p in files.items()}


class _Recording:
    """A publisher wrapper that notes the event types the bridge published."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.types: list[str] = []

    async def publish_header(self, header) -> None:
        await self.publisher.publish_header(header)

    async def publish_event(self, session_id: str, event: dict) -> None:
        self.types.append(event["type"])
        await self.publisher.publish_event(session_id, event)

    async def flush(self) -> None:
        await self.publisher.flush()


def test_runtime_killed_mid_turn_is_reported_and_nothing_it_streamed_is_lost(kafka, topics, tmp_path):
    names = topics(partitions=1)
    executable, cordis = find_runtime()
    root = tmp_path / "sessions"

    async def run(model_url: str) -> str:
        async with Publisher(kafka, names) as publisher:
            recording = _Recording(publisher)
            config = RuntimeConfig(executable=executable, cordis_config=cordis, workspace=tmp_path / "ws",
                                   session_root=root, home=tmp_path / "home", model_url=model_url,
                                   api_key=Secret("test-key"))
            async with WorkerBridge(config, recording) as bridge:
                turn = asyncio.ensure_future(bridge.prompt("real-hang", "[script:hang#hang] go"))
                deadline = time.monotonic() + 60
                while "assistant/chunk" not in recording.types:  # the model is answering, the turn is open
                    assert time.monotonic() < deadline and not turn.done(), "the turn never streamed"
                    await asyncio.sleep(0.02)  # wait-ok: polling a condition with a deadline
                os.kill(bridge.pid, signal.SIGKILL)
                with pytest.raises(RuntimeDiedError, match=r"died mid-turn in session 'real-hang' after seq (\d+)") as died:
                    await turn
                return str(died.value)

    with ScriptedModel() as model:
        message = asyncio.run(asyncio.wait_for(run(model.url), 90))
    last_seq = int(message.split("after seq ")[1].split(":")[0])
    assert "killed by signal 9" in message, message  # how it ended is said, not "exit code None"
    records = asyncio.run(consume_all(kafka, names.events, last_seq + 2, timeout=30))  # the header + seq 0..last
    live = _events_of(records)["real-hang"]
    assert [e["seq"] for e in live] == list(range(last_seq + 1)), "every streamed event was published, in order"
    assert any(e["type"] == "assistant/chunk" for e in live) and not any(e["type"] == "turn/end" for e in live)
    # what dsh had written to its file when it was killed is the same log (a prefix: its writes may lag the stream)
    stored = read_events(next(iter(find_session_files(root))))[1]
    assert 0 < len(stored) <= len(live) and canonical(stored) == canonical(live[:len(stored)])
