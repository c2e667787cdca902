"""The failover scenarios of a three-node cluster (``--replication 3
--min-insync-replicas 2``) while the projector, auditor and archiver run and
a second fleet is published: the active controller killed, the auditor's
transaction coordinator killed, two brokers down then back, the auditor
killed (``kill -9``) during a failover, the connections under the auditor's
transactions closed (its coordinator paused, then killed: the auditor goes
on, it does not exit), and a rolling restart of every node
(with the longest time each service went without a commit). Each is
counted against the simulator's ground truth: 0 lost, 0 doubled, 0 false
findings in views, archive and findings, and says how long the services
took to catch up. (A partition leader killed: ``test_cluster_failover.py``.)"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import pytest
from aiokafka.client import AIOKafkaClient, CoordinationType
from prometheus_client import REGISTRY

from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.clients import client_options
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicLayout, TopicNames
from dsh_pipeline.ground_truth import compare
from producers.fleet import fleet
from producers.publisher import Publisher
from producers.simulator import FaultPlan, SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.integration.test_cluster_failover import _doubled
from tests.kafka_fixtures import caught_up, committed_offsets, consume_all
from tests.services import archiver, auditor, projector
from tests.waiting import until

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.soak]

FAULTS = FaultPlan(unlogged=1, dropped=1, lossless=1, unknown=1)
#: Seconds a service may go without committing while a rolling restart goes on and records keep coming: one
#: controller failover (an election, then the new controller's activation) and a coordinator's move, on a
#: machine whose cores are busy with other work (measured: at most 7 s there).
COMMIT_STALL = 15.0


@dataclass
class Run:
    """What a scenario's fault needs, and the times it notes."""

    cluster: Any
    kafka: KafkaConfig
    names: TopicNames
    auditor_group: str
    work: Path
    times: dict[str, float] = field(default_factory=dict)
    auditor: Any = None  # the auditor's process, when the scenario runs it as one
    #: Per service, the longest time between two of its commits while the fault ran (``steady`` scenarios).
    commit_gaps: dict[str, float] = field(default_factory=dict)

    def note(self, what: str) -> None:
        self.times[what] = time.monotonic()


class _AuditorProcess:
    """The auditor as the CLI runs it, a process a scenario may kill; its
    positions are its group's committed offsets (transactional: what it
    has output and committed)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.committed: dict[Any, int] = {}
        self.errors = open(run.work / "auditor.err", "ab")
        self.process = self.start()

    def start(self) -> subprocess.Popen:
        prefix = self.run.names.events.removesuffix(TopicNames().events)
        return subprocess.Popen(
            [sys.executable, "-m", "dsh_pipeline.cli", "audit", "--state", str(self.run.work / "auditor.sqlite"),
             "--group", self.run.auditor_group, "--bootstrap", self.run.kafka.bootstrap, "--topic-prefix", prefix,
             "--partitions", "3", "--no-create-topics"], stdout=subprocess.DEVNULL, stderr=self.errors)

    def kill_and_restart(self) -> None:
        self.process.kill()
        self.process.wait(30)
        self.process = self.start()

    async def refresh(self) -> None:
        offsets = await committed_offsets(self.run.kafka, self.run.auditor_group)
        self.committed = {_Partition(partition): offset for (topic, partition), offset in offsets.items()
                          if topic == self.run.names.events}

    def positions(self) -> dict[Any, int]:
        return self.committed

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        self.errors.close()


@dataclass(frozen=True)
class _Partition:
    partition: int


async def _coordinator(kafka: KafkaConfig, transactional_id: str) -> int:
    client = AIOKafkaClient(**client_options(kafka))
    await client.bootstrap()
    try:
        return await client.coordinator_lookup(CoordinationType.TRANSACTION, transactional_id)
    finally:
        await client.close()


def _doubled_in(kafka: KafkaConfig, topic: str) -> int:
    async def read() -> list:
        return await consume_all(kafka, topic, sum((await end_offsets(kafka, topic)).values()), timeout=60)
    return _doubled(asyncio.run(read()))


def _commits(service: str) -> float:
    return REGISTRY.get_sample_value("dsh_consumer_commits_total", {"service": service}) or 0.0


async def _commit_gaps(run: Run, services: list[str], fault: asyncio.Future[Any]) -> None:
    """Note in ``run.commit_gaps`` each service's longest time between two
    commits (its offset commits after durable effects) until ``fault`` ends."""
    loop = asyncio.get_running_loop()
    last = {service: (_commits(service), loop.time()) for service in services}
    run.commit_gaps = dict.fromkeys(services, 0.0)
    while not fault.done():
        await asyncio.sleep(0.05)  # wait-ok: sampling the commit counters
        now = loop.time()
        for service, (count, since) in last.items():
            run.commit_gaps[service] = max(run.commit_gaps[service], now - since)
            if _commits(service) != count:
                last[service] = (_commits(service), now)


async def _publish_until(kafka: KafkaConfig, names: TopicNames, config: SimulatorConfig,
                         done: asyncio.Future[Any]) -> list[Any]:
    """Small fleets, one after another, each acknowledged before the next,
    until ``done``: records arrive all through a fault. Returns the truths."""
    truths: list[Any] = []
    async with Publisher(kafka, names) as publisher:
        for turn in itertools.count():
            if done.done() and truths:
                break
            truths += (await fleet(replace(config, seed=config.seed * 1000 + turn), publisher.send)).truths
            await publisher.flush()
    return truths


def scenario(cluster, group_id, work: Path, fault: Callable[[Run], None], what: str, *,
             auditor_process: bool = False, seed: int = 0, steady: bool = False) -> Run:
    """Run the services, publish a fleet, then a second one while ``fault``
    runs (in a thread); wait until every service has read both; compare
    with the ground truth. ``steady``: the second fleet is small fleets
    published one after another until the fault ends, and each service's
    longest time between commits meanwhile is noted. Returns the run, its
    times relative to the fault's start: ``fault done`` and ``caught up``."""
    kafka = KafkaConfig(cluster.bootstrap)
    names = TopicNames.with_prefix(f"s{uuid.uuid4().hex[:6]}.")
    run = Run(cluster, kafka, names, group_id("auditor"), work)
    first = SimulatorConfig(sessions=20, seed=100 + seed, max_turns=3, faults=FAULTS)
    second = SimulatorConfig(sessions=20, seed=200 + seed, max_turns=3, faults=FAULTS)
    services = [projector(kafka, names, group_id("projector"), work / "views.sqlite"),
                archiver(kafka, names, group_id("archiver"), work / "archive")]

    async def main() -> list:
        await prepare_topics(kafka, names, 3, layout=TopicLayout(3, 2))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(service.run(stop)) for service in services]
        audit: Any = _AuditorProcess(run) if auditor_process else auditor(kafka, names, run.auditor_group,
                                                                            state=work / "auditor.sqlite")
        run.auditor = audit
        if not auditor_process:
            tasks.append(asyncio.create_task(audit.run(stop)))

        async def all_caught_up(ends: dict[int, int], timeout: float, when: str) -> None:
            async def check() -> bool:
                if auditor_process:
                    await audit.refresh()
                return all(caught_up(s, ends) for s in [*services, audit])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not await check():
                assert not any(task.done() for task in tasks), [task for task in tasks if task.done()]
                assert not auditor_process or audit.process.poll() is None, (
                    (work / "auditor.err").read_text()[-3000:])
                if loop.time() > deadline:
                    raise AssertionError(f"timed out waiting for every service {when}")
                await asyncio.sleep(0.2)  # wait-ok: polling a condition with a deadline
        try:
            truths = await publish_fleet(kafka, names, first)
            await all_caught_up(await end_offsets(kafka, names.events), 120, "to read the first fleet")
            run.note("fault")
            faulting = asyncio.create_task(asyncio.to_thread(fault, run))
            if steady:
                gaps = asyncio.create_task(_commit_gaps(run, [s.name for s in [*services, audit]], faulting))
                truths += await _publish_until(kafka, names, replace(second, sessions=4), faulting)
                await gaps
            else:
                truths += await publish_fleet(kafka, names, second)
            await faulting
            run.note("fault done")
            await all_caught_up(await end_offsets(kafka, names.events), 180, f"after {what}")
            run.note("caught up")
            assert not any(task.done() for task in tasks), [task for task in tasks if task.done()]
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            if auditor_process:
                audit.stop()
        return truths

    truths = asyncio.run(main())
    manifest = {"truth": {truth.session_id: truth.to_json() for truth in truths}}
    expected = sum(1 for truth in truths for defect in truth.defects if defect.kind != "duplicate")
    findings = asyncio.run(consume_all(kafka, names.findings, expected, timeout=30, settle=1.5, committed_only=True))
    problems = compare(manifest, work / "views.sqlite", work / "archive", [json.loads(r.value) for r in findings])
    lost = [line for line in problems if "missing" in line or "differs" in line or "held" in line]
    false = [line for line in problems if line.startswith("unexpected finding")]
    doubled = _doubled_in(kafka, names.events)
    times = {key: value - run.times["fault"] for key, value in run.times.items() if key != "fault"}
    print(f"\ncluster: {what}: lost {len(lost)}, doubled {doubled}, false findings {len(false)}; the fault and "
          f"the second fleet's publishing took {times['fault done']:.1f} s, every service caught up "
          f"{times['caught up'] - times['fault done']:.1f} s after ({times['caught up']:.1f} s after the fault began)")
    assert problems == [] and doubled == 0, problems
    run.times = times
    return run


def test_the_active_controller_killed(kafka_cluster, group_id, tmp_path):
    def kill_controller(run: Run) -> None:
        run.cluster.kill(run.cluster.controller())
    scenario(kafka_cluster, group_id, tmp_path, kill_controller, "the active controller killed", seed=1)


def test_the_auditors_transaction_coordinator_killed(kafka_cluster, group_id, tmp_path):
    def kill_coordinator(run: Run) -> None:
        transactional_id = f"{run.auditor_group}.{run.names.events}.0"  # the auditor's, of partition 0
        run.cluster.kill(asyncio.run(_coordinator(run.kafka, transactional_id)))
    scenario(kafka_cluster, group_id, tmp_path, kill_coordinator, "the auditor's transaction coordinator killed",
             seed=2)


def test_two_brokers_down_then_back(kafka_cluster, group_id, tmp_path):
    def two_down(run: Run) -> None:
        run.cluster.kill(2)
        run.cluster.kill(3)
        threading.Event().wait(10)  # wait-ok: the outage's length is the scenario
        run.cluster.start_node(2)
        run.cluster.start_node(3)
    scenario(kafka_cluster, group_id, tmp_path, two_down, "two brokers down 10 s, then back", seed=4)


def test_the_auditor_killed_during_a_failover(kafka_cluster, group_id, tmp_path):
    def kill_both(run: Run) -> None:
        run.cluster.kill(run.cluster.controller())
        run.auditor.kill_and_restart()  # kill -9 while the cluster elects a new controller and leaders
    scenario(kafka_cluster, group_id, tmp_path, kill_both, "the auditor killed (-9) as the controller is killed",
             auditor_process=True, seed=5)


def test_the_auditors_connections_cut_under_its_transactions(kafka_cluster, group_id, tmp_path):
    def cut(run: Run) -> None:
        transactional_id = f"{run.auditor_group}.{run.names.events}.0"  # the auditor's, of partition 0
        node = asyncio.run(_coordinator(run.kafka, transactional_id))
        run.cluster.pause(node)  # its requests to the node hang, mid-transaction...
        threading.Event().wait(5)  # wait-ok: the pause's length is the scenario
        run.cluster.kill(node)  # ...then their connections close under them
        run.cluster.start_node(node)
    scenario(kafka_cluster, group_id, tmp_path, cut, "the auditor's transaction coordinator paused 5 s, then killed",
             auditor_process=True, seed=7)


def test_a_rolling_restart(kafka_cluster, group_id, tmp_path):
    back: dict[int, float] = {}

    def roll(run: Run) -> None:
        for node in sorted(run.cluster.nodes):
            began = time.monotonic()
            run.cluster.restart_node(node)  # stopped, started, serving, and its copies in sync again
            back[node] = time.monotonic() - began
    run = scenario(kafka_cluster, group_id, tmp_path, roll, "a rolling restart of the three nodes", seed=6,
                   steady=True)
    print("cluster: rolling restart: each node stopped, serving and in sync again in "
          + ", ".join(f"node {node} {seconds:.1f} s" for node, seconds in back.items())
          + "; the longest time between two commits during the roll: "
          + ", ".join(f"{service} {gap:.1f} s" for service, gap in run.commit_gaps.items()))
    assert max(run.commit_gaps.values()) <= COMMIT_STALL, run.commit_gaps
