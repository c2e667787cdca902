"""``/healthz`` per partition on a three-node cluster: a consumer counts as
answered only when the cluster answered for every partition assigned to it,
the body names the partitions that were not, and a broker killed and
restarted leaves no partition unanswered once its leaders answer again
(for a member that lived through the restart and for one started after it)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest

from consumers.runtime import GroupMember
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.clients import make_admin
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicLayout, TopicNames
from dsh_pipeline.ops_server import consumers_health
from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import caught_up
from tests.services import archiver, projector
from tests.waiting import until

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

#: Seconds without an answer after which a partition makes its member unhealthy (the command's default is 60).
STALE = 3.0


def _names() -> TopicNames:
    return TopicNames.with_prefix(f"h{uuid.uuid4().hex[:6]}.")


async def _leaders(kafka: KafkaConfig, topic: str) -> dict[int, int]:
    admin = make_admin(kafka)
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


def _silent(detail: str) -> set[str]:
    """The partitions a /healthz body names as unanswered."""
    return set(re.findall(r"(\S+\[\d+\]) for [\d.]+ s", detail))


async def _run(members: list[GroupMember], stop: asyncio.Event) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(member.run(stop)) for member in members]


def test_a_paused_leader_names_its_partition_and_a_restarted_broker_leaves_none_unanswered(kafka_cluster, group_id,
                                                                                        tmp_path):
    kafka = KafkaConfig(kafka_cluster.bootstrap)
    names = _names()
    lived = [projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite"),
             archiver(kafka, names, group_id("archiver"), tmp_path / "archive")]
    check = consumers_health({member.name: member for member in lived}, stale_after=STALE)
    seen: dict[str, float] = {}
    led_by_paused: set[str] = set()

    async def scenario() -> tuple[str, str]:
        await prepare_topics(kafka, names, 3, layout=TopicLayout(3, 2))
        stop = asyncio.Event()
        tasks = await _run(lived, stop)
        try:
            await publish_fleet(kafka, names, SimulatorConfig(sessions=12, seed=5, max_turns=2))
            ends = await end_offsets(kafka, names.events)
            await until(lambda: all(caught_up(m, ends) for m in lived) and check()[0], 90, "healthy, caught up")

            # a broker killed and started again: once it serves, every partition answers again
            leaders = await _leaders(kafka, names.events)
            killed = leaders[0]
            kafka_cluster.kill(killed)
            killed_at = time.monotonic()
            restarting = None
            try:
                await until(lambda: not check()[0], 30, "the killed leader's partition to show")
                seen["unhealthy after"] = time.monotonic() - killed_at
                restarting = asyncio.create_task(asyncio.to_thread(kafka_cluster.start_node, killed))
                await until(lambda: check()[0], 90, "health once the killed node's partitions have new leaders")
                seen["healthy again after"] = time.monotonic() - killed_at
            finally:
                if restarting is None:
                    await asyncio.to_thread(kafka_cluster.start_node, killed)
                else:
                    await restarting
            restarted = time.monotonic()
            await until(lambda: check()[0], 90, "health after the restart")
            seen["healthy after the restart"] = time.monotonic() - restarted

            # a member started after the restart answers for every partition too, led by the restarted node or not
            fresh = projector(kafka, names, group_id("projector"), tmp_path / "fresh.sqlite")
            both = consumers_health({"fresh": fresh, **{m.name: m for m in lived}}, stale_after=STALE)
            tasks += await _run([fresh], stop)
            await until(lambda: len(fresh.assignment()) == 3 and caught_up(fresh, ends), 90, "the fresh member")
            # longer than STALE: no partition may stay unanswered
            await until(lambda: time.monotonic() - restarted > 2 * STALE and both()[0], 90, "every member healthy")
            assert both() == (True, "ok")

            # a leader paused: only the partitions it leads are named
            leaders = await _leaders(kafka, names.events)
            paused = leaders[1]
            led = {f"{names.events}[{p}]" for p, node in leaders.items() if node == paused}
            led_by_paused.update(led)
            kafka_cluster.pause(paused)
            try:
                bodies: list[str] = []
                await until(lambda: bool(bodies.append(both()[1]) or _silent(bodies[-1]) >= led), 30,
                            "the paused leader to show")
                unhealthy = bodies[-1]
            finally:
                kafka_cluster.resume(paused)
            await until(lambda: both()[0], 90, "health after the pause")
            assert not any(task.done() for task in tasks), [task for task in tasks if task.done()]
            return unhealthy, both()[1]
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    unhealthy, healthy = asyncio.run(scenario())
    print(f"\ncluster health: a leader killed: unhealthy {seen['unhealthy after']:.1f} s after, healthy again "
          f"{seen['healthy again after']:.1f} s after (new leaders), and {seen['healthy after the restart']:.1f} s "
          f"after the node served again; a leader paused: {unhealthy}")
    assert healthy == "ok"
    assert _silent(unhealthy) == led_by_paused, unhealthy  # each member names them, and nothing else
    assert all(part.split(": ")[1].startswith("no answer from the cluster for ") for part in unhealthy.split("; "))
