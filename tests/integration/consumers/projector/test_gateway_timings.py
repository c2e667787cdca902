"""Real dsh 0.1.1rc1 agents behind the gateway, in front of the scripted
model, on the real broker, and the projector after them: each step of
their sessions shows the request the gateway forwarded for it, with the
upstream's first byte and duration as the gateway measured them."""

from __future__ import annotations

import asyncio

import pytest

from consumers.projector.store_reader import StoreReader
from tests.integration.consumers.projector.test_projector import run_until
from tests.integration.producers import test_gateway_agents as agents
from tests.kafka_fixtures import caught_up, end_offsets
from tests.scripted_model import ScriptedModel
from tests.services import projector

pytestmark = agents.pytestmark
SCRIPTS = {"plain": 1, "tools": 1, "retry": 1, "two-turns": 2}


def test_each_step_shows_its_gateway_request_and_the_upstreams_timings(kafka, topics, group_id, tmp_path):
    names = topics(partitions=2)
    with ScriptedModel() as model:
        asyncio.run(asyncio.wait_for(agents._fleet(kafka, names, tmp_path, model.url, SCRIPTS, "timed"), 180))
        served = len(model.requests)

    async def project() -> None:
        ends = await end_offsets(kafka, names.events)
        service = projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite")
        await run_until(service, lambda: caught_up(service, ends))

    asyncio.run(project())
    reader = StoreReader(tmp_path / "views.sqlite")
    try:
        steps = [step for name in SCRIPTS for step in reader.session_page(f"timed-{name}", None, 200)["steps"]]
    finally:
        reader.close()
    requests = [request for step in steps for request in step["gateway"]]
    assert len(requests) == served  # every request the model served, each at one step (the retried 500 too)
    assert all(step["gateway"] for step in steps if step["model"] is not None)
    for step in steps:
        for request in step["gateway"]:
            assert step["startedAt"] <= request["receivedAt"] <= step["endedAt"]
            assert request["status"] in (200, 500) and request["outcome"] == "completed"
            assert 0 <= request["upstreamFirstByteMs"] <= request["upstreamMs"] <= step["durationMs"] + 1
    assert sorted(request["status"] for request in requests).count(500) == 1  # the retry's first attempt
