"""The group member every consumer runs on, with a stand-in for aiokafka's
consumer: its state (one enum, also the ``dsh_consumer_state`` metric), and
when the cluster last answered for each assigned partition (``/healthz``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import REGISTRY

import consumers.runtime.member as member_module
from consumers.runtime import GroupMember, ServiceConfig, ServiceState
from dsh_kafka.config import KafkaConfig
from tests.waiting import until

TOPIC = "dsh.session-events"
P0, P1, P2 = (TopicPartition(TOPIC, n) for n in range(3))


class FakeConsumer:
    """What the member asks of aiokafka's consumer; a test sets the answers."""

    def __init__(self) -> None:
        self.assigned: set[TopicPartition] = set()
        self.fetched: dict[TopicPartition, int] = {}  # ms of each partition's last fetch answer
        self.ends: dict[TopicPartition, int] = {}
        self.batches: list[dict[TopicPartition, list[Any]]] = []
        self.listener: Any = None
        self.polls = 0

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        self.polls += 1
        await asyncio.sleep(0)  # wait-ok: a poll gives the loop a turn, as the real client's does
        return self.batches.pop(0) if self.batches else {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def last_poll_timestamp(self, partition: TopicPartition) -> int | None:
        return self.fetched.get(partition)

    def highwater(self, partition: TopicPartition) -> int | None:
        return None

    async def committed(self, partition: TopicPartition) -> int | None:
        return 0

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends.get(tp, 0) for tp in partitions}


class Member(GroupMember):
    def __init__(self, name: str) -> None:
        super().__init__(ServiceConfig(kafka=KafkaConfig("127.0.0.1:1"), group="g"), name)
        self.handled_batches: list[dict[TopicPartition, list[Any]]] = []
        self.fail_on_batch: Exception | None = None

    def topics(self) -> list[str]:
        return [TOPIC]

    async def opening(self) -> None:
        pass

    async def closing(self, drained: bool) -> None:
        pass

    def handle_batch(self, batch: dict[TopicPartition, list[Any]]) -> None:
        if self.fail_on_batch is not None:
            raise self.fail_on_batch
        self.handled_batches.append(batch)

    async def checkpoint(self, wait: bool = True) -> None:
        pass


def _state_metric(name: str) -> str:
    values = {state.value: REGISTRY.get_sample_value("dsh_consumer_state", {"service": name, "dsh_consumer_state":
                                                                             state.value}) for state in ServiceState}
    [current] = [state for state, value in values.items() if value == 1.0]
    return current


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeConsumer:
    consumer = FakeConsumer()
    monkeypatch.setattr(member_module, "make_consumer", lambda kafka, settings: consumer)
    return consumer


def test_the_state_goes_from_unopened_to_stopped_after_a_drain_and_the_metric_follows(fake: FakeConsumer) -> None:
    member = Member("member-drained")
    seen = [(member.state, _state_metric("member-drained"))]

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(member.run(stop))
        await until(lambda: fake.polls >= 2, 10, "the member's second poll", poll=0)
        seen.append((member.state, _state_metric("member-drained")))
        stop.set()
        await task

    asyncio.run(scenario())
    seen.append((member.state, _state_metric("member-drained")))
    assert seen == [(ServiceState.UNOPENED, "unopened"), (ServiceState.RUNNING, "running"),
                    (ServiceState.STOPPED, "stopped")]


def test_a_failure_ends_in_the_failed_state(fake: FakeConsumer) -> None:
    member = Member("member-failed")
    member.fail_on_batch = OSError("the disk is full")
    fake.batches.append({P0: [object()]})
    with pytest.raises(OSError, match="the disk is full"):
        asyncio.run(member.run(asyncio.Event()))
    assert (member.state, _state_metric("member-failed")) == (ServiceState.FAILED, "failed")


def test_a_failed_rebalance_step_stops_the_member_before_another_batch(fake: FakeConsumer) -> None:
    class Broken(Member):
        async def assigning(self, partitions: set[TopicPartition]) -> None:
            raise RuntimeError("the state rebuild failed")

    member = Broken("member-rebalance")
    fake.batches += [{}, {P0: [object()]}]

    async def scenario() -> None:
        task = asyncio.create_task(member.run(asyncio.Event()))
        await until(lambda: fake.listener is not None, 10, "the member to subscribe", poll=0)
        fake.assigned = {P0}
        with pytest.raises(RuntimeError):
            await fake.listener.on_partitions_assigned([P0])
        await task

    with pytest.raises(RuntimeError, match="the state rebuild failed"):
        asyncio.run(scenario())
    assert member.handled_batches == [] and member.state is ServiceState.FAILED


def _assigned(member: Member, fake: FakeConsumer, *partitions: TopicPartition) -> None:
    member.consumer = fake  # type: ignore[assignment]
    fake.assigned = set(partitions)
    asyncio.run(member._assign(set(partitions)))


def test_a_partition_counts_as_answered_only_by_its_own_answers(fake: FakeConsumer) -> None:
    member = Member("member-silences")
    _assigned(member, fake, P0, P1)
    now = time.time()
    fake.fetched = {P0: int(now * 1000)}  # P1's leader never answered
    member._update_lag()
    member._answered = {P0: member._answered[P0], P1: now - 12.0}  # assigned 12 s ago
    silences = member.silences()
    assert silences[f"{TOPIC}[0]"] < 1.0 and 12.0 <= silences[f"{TOPIC}[1]"] < 13.0
    member._update_lag()  # a later poll: still no answer for P1, its silence is not reset
    assert member.silences()[f"{TOPIC}[1]"] >= 12.0


def test_a_partition_seen_assigned_before_its_assignment_step_ran_ages_from_then(fake: FakeConsumer) -> None:
    """aiokafka shows a new assignment while the rebalance listener still
    runs (the poll loop goes on meanwhile): its silence starts when first
    seen and grows, never restarting at each poll."""
    member = Member("member-early")
    member.consumer = fake  # type: ignore[assignment]
    fake.assigned = {P2}
    member._update_lag()
    first = member._answered[P2]
    member._update_lag()
    assert member._answered[P2] == first


def test_a_partition_read_to_the_end_its_leader_gave_counts_as_answered(fake: FakeConsumer) -> None:
    member = Member("member-probe")
    fake.ends = {P0: 7, P1: 9}
    _assigned(member, fake, P0, P1)
    member._positions.update({P0: 7, P1: 5})  # P0 read to its end, P1 five behind
    old = time.time() - 30
    member._answered = {P0: old, P1: old}
    asyncio.run(member._probe([P0, P1]))
    assert member.silences()[f"{TOPIC}[0]"] < 1.0 and member.silences()[f"{TOPIC}[1]"] >= 30.0


def test_a_leader_that_does_not_answer_the_probe_leaves_its_partition_unanswered(fake: FakeConsumer) -> None:
    member = Member("member-probe-failed")
    _assigned(member, fake, P0)

    async def no_answer(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise TimeoutError("no answer")

    fake.end_offsets = no_answer  # type: ignore[method-assign]
    member._answered = {P0: time.time() - 30}
    asyncio.run(member._probe([P0]))
    assert member.silences()[f"{TOPIC}[0]"] >= 30.0


def test_partitions_being_taken_are_not_silent_but_the_step_s_time_shows(fake: FakeConsumer) -> None:
    """While the rebalance listener rebuilds the partitions' state (aiokafka
    fetches nothing meanwhile), their silence does not count; the step's
    time does, and their silence starts once it ends."""
    gate = asyncio.Event()
    seen: list[tuple[dict[str, float], float | None]] = []

    class Slow(Member):
        async def assigning(self, partitions: set[TopicPartition]) -> None:
            await gate.wait()

    member = Slow("member-assigning")
    member.consumer = fake  # type: ignore[assignment]
    fake.assigned = {P0}

    async def scenario() -> None:
        step = asyncio.create_task(member._assign({P0}))
        await asyncio.sleep(0)  # wait-ok: one turn of the loop starts the step, which then waits at the gate
        member._assigning = (frozenset({P0}), time.time() - 70)  # the step began 70 s ago
        member._answered = {P0: time.time() - 70}
        seen.append((member.silences(), member.assigning_for()))
        gate.set()
        await step
        seen.append((member.silences(), member.assigning_for()))

    asyncio.run(scenario())
    (during, took), (after, done) = seen
    assert during == {} and took is not None and took >= 70.0
    assert after[f"{TOPIC}[0]"] < 1.0 and done is None
