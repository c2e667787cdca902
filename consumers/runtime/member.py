"""A consumer group member on the runtime's one poll loop.

:class:`GroupMember` owns what every consumer of the project shares: the
group membership and its rebalance listener, the poll loop, the state of
the member (one :class:`ServiceState`), lag, "caught up", and when the
cluster last answered for each assigned partition (what ``/healthz``
reads). What a member does with a batch, how it checkpoints and where it
starts reading an assigned partition are its subclass's:
:class:`~.service.ConsumerService` runs a :class:`~.policy.Policy` over the
events topic; the projector's outcome index reads the findings, dead-letter
and verdicts topics into the view store.

* a rebalance callback that fails stops the member with that error before
  another record is handled (aiokafka alone would log it and carry on);
* on revoke the member checkpoints before the partitions go;
* ``stop`` drains: the current batch finishes and is checkpointed, then
  everything closes;
* a partition counts as answered when a fetch of it was answered (the
  cluster answers every long poll, records or not), or when it is read to
  the end offset its leader gave in a recent answer (see :meth:`_probe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from abc import ABC, abstractmethod
from typing import Any, Coroutine

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from dsh_kafka.clients import AUTHORIZATION_ERRORS, make_consumer
from dsh_kafka.config import ConsumerSettings
from dsh_kafka.errors import ClusterUnavailableError

from .config import ServiceConfig
from .metrics import BATCH_RECORDS, BATCH_SECONDS, LAG, STATE

__all__ = ["GroupMember", "ServiceState", "partition_fields", "partition_names"]

#: How long one poll waits for records (bounds how soon ``stop`` is seen).
_POLL_MS = 250
#: A partition without a fetch answer this long has its end offset asked of its leader.
_PROBE_AFTER = 2.0


class ServiceState(enum.Enum):
    """Where a member is in its life: one value (httpx's ``ClientState``),
    read by ``/healthz`` and the ``dsh_consumer_state`` metric."""

    UNOPENED = "unopened"  # made; not run yet
    STARTING = "starting"  # opening its files and clients, joining the group
    RUNNING = "running"  # polling and handling batches
    DRAINING = "draining"  # asked to stop: the last batch is checkpointed
    STOPPED = "stopped"  # everything handled is persisted and committed; closed
    FAILED = "failed"  # ended on an error (or cancelled); closed


class _Rebalance(ConsumerRebalanceListener):
    # aiokafka runs these in its coordinator task, which may interleave with
    # batch handling at any await: the member's lock serializes them. A
    # failure is kept for the run loop, which stops the member with it.
    def __init__(self, member: GroupMember) -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self.member.lock:
            await self._kept(self.member._revoke(set(revoked)))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self.member.lock:
            await self._kept(self.member._assign(set(assigned)))

    async def _kept(self, step: Coroutine[Any, Any, None]) -> None:
        if self.member.rebalance_failure is not None:
            step.close()  # nothing is trusted any more: the run loop raises the failure
            return
        try:
            await step
        except Exception as error:
            self.member.rebalance_failure = error
            raise


class GroupMember(ABC):
    """One member of a consumer group, run by :meth:`run` until ``stop``."""

    def __init__(self, config: ServiceConfig, name: str) -> None:
        self.config = config
        self.name = name
        self.consumer: AIOKafkaConsumer | None = None
        self.last_poll = time.monotonic()
        self.lock = asyncio.Lock()  # batch handling vs rebalance callbacks
        self.rebalance_failure: Exception | None = None
        self.log = logging.getLogger(f"dsh.{name}")
        self._state = ServiceState.UNOPENED
        STATE.labels(name).state(self._state.value)
        self._positions: dict[TopicPartition, int] = {}  # next offset to read (for lag)
        self._ends: dict[TopicPartition, int] = {}  # end offsets asked of the cluster at assignment
        self._behind = True  # since assignment, until every partition is read to its end
        #: time.time() of the cluster's last answer for each assigned partition (its assignment
        #: before any); replaced whole, never changed in place: the health check reads it from another thread
        self._answered: dict[TopicPartition, float] = {}
        #: the partitions of the assignment step running (their state rebuilt, their offsets asked), and since when
        self._assigning: tuple[frozenset[TopicPartition], float] | None = None
        self._probing: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ read-outs

    @property
    def state(self) -> ServiceState:
        return self._state

    def _enter(self, state: ServiceState) -> None:
        self._state = state
        STATE.labels(self.name).state(state.value)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member holds now."""
        return set(self.consumer.assignment()) if self.consumer is not None else set()

    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to handle, per assigned partition handled so far."""
        return dict(self._positions)

    def silences(self) -> dict[str, float]:
        """Seconds since the cluster last answered for each assigned
        partition (``topic[n]``; since its assignment, if it never did).
        Safe from another thread: the run loop notes the answers, this only
        reads the note."""
        now, assigning = time.time(), self._assigning
        being_assigned = assigning[0] if assigning is not None else frozenset()
        return {f"{tp.topic}[{tp.partition}]": max(0.0, now - answered) for tp, answered in self._answered.items()
                if tp not in being_assigned}

    def assigning_for(self) -> float | None:
        """Seconds the running assignment step has taken (rebuilding the
        partitions' state, asking their offsets); ``None`` when none runs.
        Its partitions are not fetched meanwhile, so they count in
        :meth:`silences` only once it ends. Safe from another thread."""
        assigning = self._assigning
        return None if assigning is None else max(0.0, time.time() - assigning[1])

    # ---------------------------------------------------------------- hooks

    @abstractmethod
    def topics(self) -> list[str]:
        """The topics this member reads."""

    def consumer_settings(self) -> ConsumerSettings:
        return self.config.consumer_settings()

    @abstractmethod
    async def opening(self) -> None:
        """Before joining the group: open files and clients (``consumer`` exists)."""

    @abstractmethod
    async def closing(self, drained: bool) -> None:
        """After the consumer stopped: release everything (whatever failed before)."""

    @abstractmethod
    def handle_batch(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Handle one fetched batch (under the lock); note each partition's
        next offset with :meth:`handled`."""

    @abstractmethod
    async def checkpoint(self, wait: bool = True) -> None:
        """Make what was handled durable and commit its offsets (in the
        background unless ``wait``; a later checkpoint waits for it)."""

    async def after_poll(self) -> None:
        """After each poll and its batch, if any (a background commit's failure is raised here)."""

    async def abandon(self) -> None:
        """The member fails: drop work in flight before everything closes."""

    async def assigning(self, partitions: set[TopicPartition]) -> None:
        """Partitions arrived: rebuild their state before reading starts."""

    async def revoking(self, partitions: set[TopicPartition]) -> None:
        """Partitions are leaving: checkpoint what was handled of them."""
        await self.checkpoint()

    async def start_positions(self, partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
        """Where reading each assigned partition starts: the group's
        committed offset, else what ``start_from`` says."""
        assert self.consumer is not None
        positions, fresh = {}, []
        for partition in partitions:
            committed = await self.consumer.committed(partition)
            if committed is None:
                fresh.append(partition)
            else:
                positions[partition] = committed
        if fresh:
            start = (self.consumer.end_offsets if self.config.start_from == "latest"
                     else self.consumer.beginning_offsets)
            positions.update(await start(fresh))
        return positions

    def handled(self, partition: TopicPartition, position: int) -> None:
        self._positions[partition] = position

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        self._enter(ServiceState.STARTING)
        self.consumer = make_consumer(self.config.kafka, self.consumer_settings())
        self.consumer.subscribe(self.topics(), listener=_Rebalance(self))
        drained = False
        try:
            await self.opening()
            self.log.info("consuming %s in group %s", ", ".join(self.topics()), self.config.group)
            await self.consumer.start()
            self._enter(ServiceState.RUNNING)
            while not stop.is_set():
                batch = await self.consumer.getmany(timeout_ms=_POLL_MS, max_records=self.config.max_records)
                self._raise_rebalance_failure()
                self.last_poll = time.monotonic()
                if batch:
                    started = time.perf_counter()
                    async with self.lock:
                        self.handle_batch(batch)
                        await self.checkpoint(wait=False)
                    BATCH_SECONDS.labels(self.name).observe(time.perf_counter() - started)
                    BATCH_RECORDS.labels(self.name).observe(sum(len(r) for r in batch.values()))
                await self.after_poll()
                self._note_progress()
            self._enter(ServiceState.DRAINING)
            async with self.lock:
                self._raise_rebalance_failure()
                await self.checkpoint()
            drained = True
            self.log.info("stopped: everything handled is persisted and committed")
        except AUTHORIZATION_ERRORS as error:
            self.log.error("stopping: the cluster refused %s", error, extra={"reason": type(error).__name__})
            raise ClusterUnavailableError(f"the cluster refused this {self.name} ({type(error).__name__}); its "
                                          "principal needs the ACLs `dsh-pipeline acls` lists") from error
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError):
                self.log.error("stopping on %s: %s", type(error).__name__, error,
                               extra={"reason": type(error).__name__})
            raise
        finally:
            await self._shut_down(drained)

    async def _shut_down(self, drained: bool) -> None:
        try:
            if self._probing is not None:
                self._probing.cancel()
                with contextlib.suppress(BaseException):
                    await self._probing
            if not drained:
                await self.abandon()
            assert self.consumer is not None
            await self.consumer.stop()
        finally:
            try:
                await self.closing(drained)
            finally:
                self._enter(ServiceState.STOPPED if drained else ServiceState.FAILED)

    def _raise_rebalance_failure(self) -> None:
        if self.rebalance_failure is not None:
            raise self.rebalance_failure

    # ----------------------------------------------------------- rebalances

    async def _revoke(self, partitions: set[TopicPartition]) -> None:
        if partitions:
            self.log.info("revoked partitions %s (after their last checkpoint)", partition_names(partitions),
                          extra=partition_fields(partitions))
        try:
            await self.revoking(partitions)
        finally:
            self._answered = {tp: at for tp, at in self._answered.items() if tp not in partitions}
            for partition in partitions:
                self._positions.pop(partition, None)
                self._ends.pop(partition, None)
                with contextlib.suppress(KeyError):
                    LAG.remove(self.name, self._lag_label(partition))

    async def _assign(self, partitions: set[TopicPartition]) -> None:
        assert self.consumer is not None
        self._assigning = (frozenset(partitions), time.time())
        try:
            await self.assigning(partitions)
            self._positions.update(await self.start_positions(partitions))
            self._ends.update(await self.consumer.end_offsets(list(partitions)))
        finally:
            self._assigning = None
            # their silence starts when reading them may start
            self._answered = {**self._answered, **dict.fromkeys(partitions, time.time())}
        self._behind = True
        behind = self._update_lag()
        self.log.info("assigned partitions %s: %d record(s) to read", partition_names(partitions), behind or 0,
                      extra={"count": behind, **partition_fields(partitions)})

    # ------------------------------------------------------------- progress

    def _lag_label(self, partition: TopicPartition) -> str:
        """A partition's lag label: its number (a member of one topic), else ``topic[n]``."""
        return str(partition.partition) if len(self.topics()) == 1 else f"{partition.topic}[{partition.partition}]"

    def _update_lag(self) -> int | None:
        """Note the cluster's answers, and set each assigned partition's
        lag: its end offset (as the last fetch answered, else as asked at
        assignment) less its position. Returns the records behind in all,
        ``None`` while an end or a position is unknown."""
        assert self.consumer is not None
        behind: int | None = 0
        assigned = self.consumer.assignment()
        answered, now = self._answered, time.time()
        fetched = {tp: stamp / 1000 for tp in assigned if (stamp := self.consumer.last_poll_timestamp(tp)) is not None}
        self._answered = {tp: max(answered.get(tp, now), fetched.get(tp, 0.0)) for tp in assigned}
        for partition in assigned:
            end = self.consumer.highwater(partition)
            if end is None:
                end = self._ends.get(partition)
            position = self._positions.get(partition)
            if end is None or position is None:
                behind = None
                continue
            lag = max(0, end - position)
            LAG.labels(self.name, self._lag_label(partition)).set(lag)
            if behind is not None:
                behind += lag
        return behind

    def _note_progress(self) -> None:
        """After each poll: the lag, "caught up" once since the assignment
        (every assigned partition read to its end), and a probe of the
        partitions the fetcher has not heard of lately."""
        if self._update_lag() == 0 and self._behind and self.assignment():
            self._behind = False
            self.log.info("caught up: every assigned partition read to its end",
                          extra={"topic": ", ".join(self.topics())})
        if self._probing is None or self._probing.done():
            now = time.time()
            quiet = [tp for tp, at in self._answered.items() if now - at >= _PROBE_AFTER and tp in self._positions]
            self._probing = asyncio.create_task(self._probe(quiet)) if quiet else None

    async def _probe(self, partitions: list[TopicPartition]) -> None:
        """Ask the partitions' leaders for their end offsets: a partition read
        to the end its leader just gave has missed nothing, and counts as
        answered though no fetch answer of it was noted (aiokafka notes one
        only for an error-free answer at the position it still holds, and
        sends a node no fetch while records it fetched from it wait to be
        handled). A leader that does not answer leaves its partitions
        unanswered: the fetcher reports why."""
        assert self.consumer is not None
        try:
            ends = await self.consumer.end_offsets(partitions)
        except Exception as error:  # noqa: BLE001 - the missing answer is the report (/healthz)
            self.log.debug("end offsets of %s not answered: %s", partition_names(set(partitions)), error)
            return
        now = time.time()
        read = {tp for tp, end in ends.items() if self._positions.get(tp, -1) >= end}
        self._answered = {tp: now if tp in read else at for tp, at in self._answered.items()}


def partition_fields(partitions: set[TopicPartition]) -> dict[str, Any]:
    """The log fields of a line about ``partitions`` (of one topic)."""
    return {"topic": min((tp.topic for tp in partitions), default=None),
            "partitions": sorted(tp.partition for tp in partitions)}


def partition_names(partitions: set[TopicPartition]) -> str:
    """``topic [0, 1, 5]`` for each topic."""
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return "; ".join(f"{topic} {numbers}" for topic, numbers in by_topic.items()) or "none"
