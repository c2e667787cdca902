"""The projector against the real broker: views equal the ground truth."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from consumers.projector import Projector, ViewStore
from dsh_core.kafka.config import ConsumerSettings
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, fleet, simulate_session

pytestmark = pytest.mark.kafka


async def publish_fleet(kafka, names, config: SimulatorConfig):
    async with Publisher(kafka, names) as publisher:
        truths = await fleet(config, publisher.send)
        await publisher.flush()
    return truths


async def run_until(service, condition, timeout: float = 90.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while not condition():
            if task.done():
                task.result()
                raise AssertionError("the service stopped early")
            if loop.time() > deadline:
                raise AssertionError("timed out waiting for the service to catch up")
            await asyncio.sleep(0.1)  # wait-ok: polling a condition with a deadline
    finally:
        stop.set()
        await task


def views_match(store_path, truths) -> bool:
    if not store_path.exists():
        return False
    store = ViewStore(store_path)
    try:
        for truth in truths:
            view = store.view(truth.session_id)
            if view is None or view["nextSeq"] != truth.next_seq or view.get("messagesDigest") != truth.messages_digest:
                return False
        return True
    finally:
        store.close()


def test_views_equal_ground_truth_and_view_command(kafka, topics, group_id, tmp_path):
    names = topics(partitions=6)
    config = SimulatorConfig(sessions=40, seed=21, max_turns=3)
    truths = asyncio.run(publish_fleet(kafka, names, config))
    db = tmp_path / "views.sqlite"

    async def project() -> None:
        projector = Projector(kafka, names, db, settings=ConsumerSettings(group_id=group_id("projector")),
                              hot_sessions=10)  # a small LRU: sessions go cold and come back
        await run_until(projector, lambda: views_match(db, truths))

    asyncio.run(project())
    session_id = truths[0].session_id
    shown = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "view", session_id, "--db", str(db), "--json"],
                           capture_output=True, check=True)
    _, batches = simulate_session(config, int(session_id.split("-")[2]))
    from dsh_core.jsonvalue import sha256_jcs
    assert sha256_jcs(json.loads(shown.stdout)) == truths[0].messages_digest
    human = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "view", session_id, "--db", str(db)],
                           capture_output=True, text=True, check=True)
    assert human.stdout.startswith(f"session {session_id}: idle")
