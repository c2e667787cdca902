"""The projector against the real broker: views equal the ground truth."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from consumers.projector import Projection, ProjectorConfig, ViewStore, projector_service
from consumers.runtime import ConsumerService, ProducerOutputs, ServiceState
from dsh_core.jsonvalue import sha256_jcs
from dsh_kafka.records import KIND_RECORD
from producers.publisher import Publisher
from producers.fleet import fleet
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.handover import hand_over
from tests.services import projector
from tests.kafka_fixtures import caught_up, consume_all, end_offsets, group_lag
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


async def publish_fleet(kafka, names, config: SimulatorConfig):
    async with Publisher(kafka, names) as publisher:
        truths = (await fleet(config, publisher.send)).truths
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
        service = projector(kafka, names, group_id("projector"), db, hot_sessions=10)  # sessions go cold, come back
        await run_until(service, lambda: views_match(db, truths))

    asyncio.run(project())
    session_id = truths[0].session_id
    shown = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "view", session_id, "--store", str(db), "--json"],
                           capture_output=True, check=True)
    assert sha256_jcs(json.loads(shown.stdout)) == truths[0].messages_digest
    human = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "view", session_id, "--store", str(db)],
                           capture_output=True, text=True, check=True)
    assert human.stdout.startswith(f"session {session_id}: idle")


def test_gap_holds_then_heals_when_the_record_is_reshipped(kafka, topics, group_id, tmp_path):
    names = topics(partitions=2)
    config = SimulatorConfig(sessions=1, seed=5, min_turns=3, max_turns=3)
    truth, batches = simulate_session(config, 0)
    records = [r for batch in batches for r in batch]
    missing = next(r for r in records if r.kind == KIND_RECORD and r.count == 1 and r.seq > 10)
    db = tmp_path / "views.sqlite"

    async def scenario() -> None:
        async with Publisher(kafka, names) as publisher:
            await publisher.send_many([r for r in records if r is not missing])
            await publisher.flush()
        first = projector(kafka, names, group_id("projector"), db)

        def held() -> bool:
            if not db.exists():
                return False
            store = ViewStore(db)
            try:
                view = store.view(truth.session_id)
                return view is not None and view["status"] == "held" and view["heldFrom"] == missing.seq
            finally:
                store.close()

        await run_until(first, held)
        async with Publisher(kafka, names) as publisher:  # the shipper re-ships the lost record
            await publisher.send(missing)
            await publisher.flush()
        await run_until(projector_service(first.config), lambda: views_match(db, [truth]))

    asyncio.run(scenario())


def test_rebalance_two_projectors_one_stopped_midway(kafka, topics, group_id, tmp_path):
    names = topics(partitions=6)
    config = SimulatorConfig(sessions=120, seed=8, max_turns=4)
    truths = asyncio.run(publish_fleet(kafka, names, config))
    db = tmp_path / "views.sqlite"
    group = group_id("projector")
    prefix = names.events[: -len("dsh.session-events")]
    command = [sys.executable, "-m", "dsh_pipeline.cli", "project", "--store", str(db), "--group", group,
               "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "6"]
    total = asyncio.run(group_lag(kafka, names.events, group))
    logs = [tmp_path / "first.log", tmp_path / "second.log"]

    def said() -> str:  # the members' output, for a failure message
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)

    with open(logs[0], "wb") as first_log, open(logs[1], "wb") as second_log, \
            subprocess.Popen(command, stdout=first_log, stderr=subprocess.STDOUT) as first, \
            subprocess.Popen(command, stdout=second_log, stderr=subprocess.STDOUT) as second:
        try:
            wait_for(lambda: asyncio.run(group_lag(kafka, names.events, group)) <= total * 0.8, 120, "progress")
            first.send_signal(signal.SIGTERM)  # one member leaves mid-run: its partitions move
            assert first.wait(60) == 0, "the first member failed"
            wait_for(lambda: views_match(db, truths), 120, "views to converge", poll=0.1)
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0, "the second member failed"
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{said()}") from None


def test_partitions_come_back_after_another_member_moved_their_views_on(kafka, topics, group_id, tmp_path):
    names = topics(partitions=4)
    db, group = tmp_path / "views.sqlite", group_id("projector")
    truths = asyncio.run(hand_over(kafka, names, lambda: projector(kafka, names, group, db),
                                   SimulatorConfig(sessions=40, seed=73, min_turns=3, max_turns=4)))
    assert views_match(db, truths)


def test_heads_a_crash_left_unacknowledged_are_published_on_assignment(kafka, topics, group_id, tmp_path):
    names = topics(partitions=3)
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=8, seed=23, max_turns=2)))
    db, group = tmp_path / "views.sqlite", group_id("projector")

    class Crash(Exception):
        pass

    class Unacknowledged(ProducerOutputs):
        """Heads that never reach Kafka: the process dies before the ack."""

        async def publish(self) -> None:
            self.pending.clear()

        async def flush(self) -> None:
            raise Crash("died before the heads were acknowledged")

    async def scenario() -> None:
        config = ProjectorConfig(kafka=kafka, topics=names, group=group, store=db)
        crashing = ConsumerService(config, Projection(config), Unacknowledged(kafka, names, Projection.name))
        with pytest.raises(Crash):
            await asyncio.wait_for(crashing.run(asyncio.Event()), 60)
        restarted = projector_service(config)
        ends = await end_offsets(kafka, names.events)
        await run_until(restarted, lambda: caught_up(restarted, ends))

    republished = REGISTRY.get_sample_value("dsh_projector_heads_republished_total")
    asyncio.run(scenario())
    assert REGISTRY.get_sample_value("dsh_projector_heads_republished_total") > republished
    heads = asyncio.run(consume_all(kafka, names.views, len(truths), timeout=30, settle=1))
    assert sorted((r.key.decode(), json.loads(r.value)["seq"]) for r in heads) == sorted(
        (truth.session_id, truth.next_seq) for truth in truths)  # each session's final head, once


def test_the_lag_of_every_assigned_partition_shows_from_the_first_fetch(kafka, topics, group_id, tmp_path):
    from prometheus_client import REGISTRY

    from consumers.runtime.metrics import LAG
    LAG.clear()  # no gauge left by an earlier test's service
    names = topics(partitions=3)
    asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=30, seed=71, max_turns=2)))
    ends = asyncio.run(end_offsets(kafka, names.events))
    service = projector(kafka, names, group_id("lag"), tmp_path / "views.sqlite", max_records=5)

    def lags() -> dict[int, float | None]:
        return {partition: REGISTRY.get_sample_value("dsh_consumer_lag_records",
                                                     {"service": "projector", "partition": str(partition)})
                for partition in ends}

    seen: list[tuple[dict, dict]] = []

    def first_batch_done() -> bool:
        positions = {tp.partition: offset for tp, offset in service.positions().items()}
        if sum(positions.values()) == 0:
            return False
        seen.append((lags(), positions))
        return all(value is not None for value in seen[-1][0].values())

    asyncio.run(run_until(service, first_batch_done))
    shown, positions = seen[-1]
    unread = [partition for partition in ends if positions.get(partition, 0) == 0]
    assert unread, positions  # some partition was not read yet: its lag shows all of it
    assert all(shown[partition] == ends[partition] for partition in unread), (shown, ends)


def test_a_static_member_catches_up_and_its_restart_does_too(kafka, topics, group_id, tmp_path):
    names = topics(partitions=3)
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=10, seed=72, max_turns=2)))
    ends = asyncio.run(end_offsets(kafka, names.events))
    group, db = group_id("static"), tmp_path / "views.sqlite"
    for _ in range(2):  # the same instance id again, as after a restart
        service = projector(kafka, names, group, db, instance_id="projector-host-1", session_timeout_ms=30_000)
        asyncio.run(run_until(service, lambda: caught_up(service, ends)))
        assert service.state is ServiceState.STOPPED
    assert views_match(db, truths)


def test_two_members_lag_series_add_up_to_the_broker_side_lag(kafka, topics, group_id, tmp_path):
    from prometheus_client import REGISTRY

    from consumers.runtime.metrics import LAG
    from tests.kafka_fixtures import group_lag
    from tests.waiting import until
    LAG.clear()
    names = topics(partitions=6)
    # a backlog the group catches up on in small batches, so it lasts while the second member joins
    asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=300, seed=73, max_turns=3)))
    group, batch = group_id("lag2"), 20
    members = [projector(kafka, names, group, tmp_path / "views.sqlite", max_records=batch) for _ in range(2)]

    def series() -> float | None:
        """The lag series summed over every partition; ``None`` while one is missing."""
        values = [REGISTRY.get_sample_value("dsh_consumer_lag_records", {"service": "projector", "partition": str(p)})
                  for p in range(6)]
        return None if None in values else sum(values)

    async def scenario() -> tuple[int, float, int]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(member.run(stop)) for member in members]
        try:
            await until(lambda: all(member.assignment() for member in members)
                        and len(members[0].assignment() | members[1].assignment()) == 6
                        and series() is not None, 90, "both members assigned, every partition's lag shown", 0.05)
            before = await group_lag(kafka, names.events, group)
            shown = series()
            after = await group_lag(kafka, names.events, group)
            assert not any(task.done() for task in tasks)
            return before, shown, after
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    before, shown, after = asyncio.run(scenario())
    # The gauges count from the records handled, the broker from those committed, and the members go on
    # between the samples: a batch in flight per member either way.
    assert after - 2 * batch <= shown <= before + 2 * batch, (before, shown, after)
