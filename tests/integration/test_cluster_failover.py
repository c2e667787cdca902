"""A three-node cluster (``dsh-pipeline kafka start --nodes 3``'s launcher)
losing a broker: commands started during the outage verify or create the
topics with the copies asked and run, a weaker existing topic is named, and
a partition leader killed mid-run loses, doubles and invents nothing against
the simulator's ground truth. (More copies than the cluster has brokers:
``test_topic_layout.py``.)"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import time
import uuid

import pytest

from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.clients import make_admin
from dsh_kafka.config import KafkaConfig
from dsh_kafka.records import KIND_RECORD, decode_kafka_record
from dsh_kafka.topics import TopicLayout, TopicNames
from dsh_pipeline.ground_truth import compare
from producers.simulator import FaultPlan, SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import caught_up, consume_all
from tests.services import archiver, auditor, projector
from tests.waiting import until

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

#: What the issue's operators asked of their topics: every partition on all three nodes, two acknowledging.
DURABLE = ("--replication", "3", "--min-insync-replicas", "2")


def _names() -> TopicNames:
    return TopicNames.with_prefix(f"c{uuid.uuid4().hex[:6]}.")


def _simulate(bootstrap: str, names: TopicNames, *options: str, timeout: float = 180) -> subprocess.CompletedProcess:
    prefix = names.events.removesuffix(TopicNames().events)
    return subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "3", "--max-turns", "1",
                           "--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", "3", *options],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _no_misdiagnosis(done: subprocess.CompletedProcess) -> None:
    for wrong in ("Traceback", "InternalError", "TLS", "SASL", "credentials"):
        assert wrong not in done.stderr, done.stderr[-3000:]


async def _copies(kafka: KafkaConfig, topic: str) -> set[int]:
    """How many copies each partition of ``topic`` has (a broker that is down still holds its copies)."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        return {len(p["replicas"]) for t in await admin.describe_topics([topic]) for p in t["partitions"]}
    finally:
        await admin.close()


def test_commands_started_while_a_broker_is_down_verify_or_create_the_topics_and_run(kafka_cluster):
    kafka = KafkaConfig(kafka_cluster.bootstrap)
    existing, missing = _names(), _names()
    asyncio.run(prepare_topics(kafka, existing, 3, layout=TopicLayout(3, 2)))
    kafka_cluster.kill(1)  # the first bootstrap address, and still listed by the cluster for a few seconds
    for names in (existing, missing):
        started = time.monotonic()
        done = _simulate(kafka_cluster.bootstrap, names, *DURABLE)
        assert done.returncode == 0, done.stderr[-3000:]
        _no_misdiagnosis(done)
        assert done.stdout.startswith("simulated 3 sessions"), done.stdout
        print(f"\ncluster: with node 1 killed, a command on {'existing' if names is existing else 'new'} topics ran "
              f"in {time.monotonic() - started:.1f} s")
    assert asyncio.run(_copies(kafka, missing.events)) == {3}  # never fewer than asked: node 1 holds one when back


def test_an_existing_weaker_topic_is_named_never_used(kafka_cluster):
    names = _names()
    asyncio.run(prepare_topics(KafkaConfig(kafka_cluster.bootstrap), names, 3, layout=TopicLayout(2, 1)))
    done = _simulate(kafka_cluster.bootstrap, names, *DURABLE)
    assert done.returncode == 1, done.stderr[-3000:]
    _no_misdiagnosis(done)
    assert (f"TopicMismatchError: topic {names.events} has 2 copies of a partition, 3 were asked (--replication)"
            in done.stderr)
    weaker_insync = _names()
    asyncio.run(prepare_topics(KafkaConfig(kafka_cluster.bootstrap), weaker_insync, 3, layout=TopicLayout(3, 1)))
    done = _simulate(kafka_cluster.bootstrap, weaker_insync, *DURABLE)
    assert done.returncode == 1 and (f"TopicMismatchError: topic {weaker_insync.events} has min.insync.replicas=1, "
                                     "below the 2 --min-insync-replicas asked") in done.stderr, done.stderr[-3000:]


async def _leader(kafka: KafkaConfig, topic: str, partition: int) -> int:
    admin = make_admin(kafka)
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
        return next(p["leader"] for p in described["partitions"] if p["partition"] == partition)
    finally:
        await admin.close()


def _doubled(records) -> int:
    """Records of the events topic that repeat a (session, seq) already in it."""
    seen = collections.Counter()
    for record in records:
        decoded = decode_kafka_record(record)
        if decoded.kind == KIND_RECORD:
            seen[(decoded.session_id, decoded.seq)] += 1
    return sum(count - 1 for count in seen.values())


def test_a_partition_leader_killed_mid_run_loses_doubles_and_invents_nothing(kafka_cluster, group_id, tmp_path):
    kafka = KafkaConfig(kafka_cluster.bootstrap)
    names = _names()
    faults = FaultPlan(unlogged=2, dropped=1, lossless=1, unknown=1)
    first = SimulatorConfig(sessions=40, seed=91, max_turns=3, faults=faults)
    second = SimulatorConfig(sessions=40, seed=92, max_turns=3, faults=faults)
    services = [projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite"),
                auditor(kafka, names, group_id("auditor"), state=tmp_path / "auditor.sqlite"),
                archiver(kafka, names, group_id("archiver"), tmp_path / "archive")]
    timings: dict[str, float] = {}

    async def scenario() -> list:
        await prepare_topics(kafka, names, 3, layout=TopicLayout(3, 2))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(service.run(stop)) for service in services]
        try:
            truths = await publish_fleet(kafka, names, first)
            ends = await end_offsets(kafka, names.events)
            await until(lambda: all(caught_up(s, ends) for s in services), 90, "the first fleet")
            leader = await _leader(kafka, names.events, 0)

            def kill() -> None:
                kafka_cluster.kill(leader)
                timings["killed"] = time.monotonic()
            killing = asyncio.create_task(asyncio.to_thread(kill))  # while the second fleet is published
            truths += await publish_fleet(kafka, names, second)
            await killing
            timings["published"] = time.monotonic() - timings["killed"]
            ends = await end_offsets(kafka, names.events)
            await until(lambda: all(caught_up(s, ends) for s in services), 120, "every service after the kill")
            timings["caught up"] = time.monotonic() - timings["killed"]
            assert not any(task.done() for task in tasks), [task for task in tasks if task.done()]
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        return truths

    truths = asyncio.run(scenario())
    manifest = {"truth": {truth.session_id: truth.to_json() for truth in truths}}
    expected = sum(1 for truth in truths for defect in truth.defects if defect.kind != "duplicate")

    async def read() -> tuple[list, list]:
        findings = await consume_all(kafka, names.findings, expected, timeout=30, settle=1.5, committed_only=True)
        events = await consume_all(kafka, names.events, sum(ends_ for ends_ in (await end_offsets(
            kafka, names.events)).values()), timeout=60)
        return findings, events
    findings, events = asyncio.run(read())
    problems = compare(manifest, tmp_path / "views.sqlite", tmp_path / "archive", [json.loads(r.value) for r in findings])
    lost = [line for line in problems if "missing" in line or "differs" in line or "held" in line]
    false = [line for line in problems if line.startswith("unexpected finding")]
    print(f"\ncluster: leader of {names.events}[0] killed mid-publish; the fleet published "
          f"{timings['published']:.1f} s and every service caught up {timings['caught up']:.1f} s after; lost {len(lost)}, doubled {_doubled(events)}, false findings "
          f"{len(false)}")
    assert problems == [] and _doubled(events) == 0, problems

