"""The one consumer runtime: group membership, batches, errors, checkpoints.

A :class:`ConsumerService` runs a :class:`~.policy.Policy` (what to do with
a record) with its :class:`~.outputs.Outputs` (where records go, how offsets
are committed). It guarantees:

* records of a partition are handled in offset order, in poll batches;
* a record that cannot be decoded, that the policy refuses, or that makes
  the policy fail unexpectedly (an :class:`InternalError` naming the
  exception) goes to :meth:`Policy.refuse` (by default the dead-letter
  topic, with the reason and ``topic[partition]@offset``) and is counted;
  nothing is skipped silently and one record never stops the service; only
  failures of the store, the disk or the cluster do;
* offsets are committed only after :meth:`Policy.persist` returned and every
  record it queued was acknowledged, never on a failure; auto-commit is off;
  a commit the group refuses because it moved the partitions on (this
  member's session expired) is logged, not fatal: the new owner reads those
  records again and skips what was applied;
* that acknowledgement wait and the commit run while the next batch is
  fetched and handled; the next checkpoint waits for them, so commits stay
  in order and a failure still stops the service;
* on revoke the service checkpoints before the partitions go; on assign the
  policy may ask for the group's committed offsets;
* ``stop`` drains: the current batch finishes, is persisted and committed,
  then everything closes;
* a rebalance callback that fails stops the service with that error before
  another record is handled (aiokafka alone would log it and carry on).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sqlite3
import time
from typing import Any, Coroutine

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from dsh_core.errors import DecodeError, DshError, InternalError, PipelineError
from dsh_kafka.errors import ClusterUnavailableError
from dsh_kafka.clients import AUTHORIZATION_ERRORS, make_consumer
from dsh_kafka.records import decode_kafka_record, where_of

from .config import ServiceConfig
from .metrics import BATCH_RECORDS, BATCH_SECONDS, COMMITS, LAG, RECORDS
from .outputs import Outputs
from .policy import Policy

__all__ = ["ConsumerService"]

#: How long one poll waits for records (bounds how soon ``stop`` is seen).
_POLL_MS = 250
#: Failures of what a service stands on, never of one record: they stop it.
_INFRASTRUCTURE = (PipelineError, OSError, sqlite3.OperationalError, MemoryError)


class _Rebalance(ConsumerRebalanceListener):
    # aiokafka runs these in its coordinator task, which may interleave with
    # batch handling at any await: the service lock serializes them. A
    # failure is kept for the run loop, which stops the service with it.
    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self.service.lock:
            await self._kept(self.service._revoke(set(revoked)))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self.service.lock:
            await self._kept(self.service._assign(set(assigned)))

    async def _kept(self, step: Coroutine[Any, Any, None]) -> None:
        if self.service.rebalance_failure is not None:
            step.close()  # nothing is trusted any more: the run loop raises the failure
            return
        try:
            await step
        except Exception as error:
            self.service.rebalance_failure = error
            raise


class ConsumerService:
    """A consumer group member running one policy over the events topic."""

    def __init__(self, config: ServiceConfig, policy: Policy, outputs: Outputs) -> None:
        self.config = config
        self.policy = policy
        self.outputs = outputs
        self.name = policy.name
        self.consumer: AIOKafkaConsumer | None = None
        self.last_poll = time.monotonic()
        self.healthy = False
        self.drained = False  # the last run ended with everything handled persisted and committed
        self.lock = asyncio.Lock()  # batch handling vs rebalance callbacks
        self.rebalance_failure: Exception | None = None
        self._uncommitted: dict[TopicPartition, int] = {}  # next offset to commit
        self._positions: dict[TopicPartition, int] = {}  # next offset to read (for lag)
        self._ends: dict[TopicPartition, int] = {}  # end offsets asked of the cluster at assignment
        self._committing: asyncio.Task[None] | None = None  # the last checkpoint's flush and commit
        self._counters: dict[str, Any] = {}
        self.log = logging.getLogger(f"dsh.{self.name}")
        self._behind = True  # since assignment, until every partition is read to its end
        self._last_answer: float | None = None  # time.time() of the cluster's newest fetch answer

    # ------------------------------------------------------------ read-outs

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member holds now."""
        return set(self.consumer.assignment()) if self.consumer is not None else set()

    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to handle, per assigned partition handled so far."""
        return dict(self._positions)

    def silent_for(self) -> float | None:
        """Seconds since the cluster last answered a fetch of an assigned
        partition (it answers every long poll, records or not); ``None``
        with nothing assigned or nothing fetched yet. Safe from another
        thread: the run loop notes the answers, this only reads the note."""
        answered = self._last_answer
        return None if answered is None else max(0.0, time.time() - answered)

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        self.consumer = consumer = make_consumer(self.config.kafka, self.config.consumer_settings())
        consumer.subscribe([self.config.topics.events], listener=_Rebalance(self))
        try:
            await self.outputs.start(self.consumer)
            await self.policy.open(self.outputs)
            self.log.info("consuming %s in group %s", self.config.topics.events, self.config.group)
            await self.consumer.start()
            self.healthy = True
            while not stop.is_set():
                batch = await self.consumer.getmany(timeout_ms=_POLL_MS, max_records=self.config.max_records)
                self._raise_rebalance_failure()
                if self._committing is not None and self._committing.done():
                    await self._commit_done()  # a failed commit stops the service even with no new batch
                self.last_poll = time.monotonic()
                if batch:
                    started = time.perf_counter()
                    async with self.lock:
                        self.handle_batch(batch)
                        await self._checkpoint(wait=False)
                    BATCH_SECONDS.labels(self.name).observe(time.perf_counter() - started)
                    BATCH_RECORDS.labels(self.name).observe(sum(len(r) for r in batch.values()))
                self._note_progress()
            async with self.lock:
                self._raise_rebalance_failure()
                await self._checkpoint()
            self.drained = True
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
            self.healthy = False
            await self._shut_down(consumer)

    async def _shut_down(self, consumer: AIOKafkaConsumer) -> None:
        if self._committing is not None:  # only when failing: a clean drain awaited it
            self._committing.cancel()
            with contextlib.suppress(BaseException):
                await self._committing
        try:
            await consumer.stop()
        finally:
            try:
                await self.policy.close(self.drained)
            finally:
                await self.outputs.stop()

    def _raise_rebalance_failure(self) -> None:
        if self.rebalance_failure is not None:
            raise self.rebalance_failure

    def handle_batch(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Hand one fetched batch to the policy, record by record in offset
        order; every record ends applied, held, a duplicate or refused."""
        policy = self.policy
        refused: collections.Counter[tuple[str, bool]] = collections.Counter()
        first: dict[str, tuple[Any, str]] = {}  # reason -> its first record and what was wrong with it
        policy.prepare({record.key.decode("utf-8", "replace") for records in batch.values() for record in records
                        if record.key})
        try:
            for partition, records in batch.items():
                for record in records:
                    try:
                        decoded = decode_kafka_record(record)
                        policy.tally.add(self._counter(decoded.kind))
                        policy.handle(record, decoded)
                    except _INFRASTRUCTURE:
                        raise  # the store, the disk or the cluster: the service stops, nothing is committed
                    except DshError as error:
                        if isinstance(error, DecodeError):
                            policy.tally.add(self._counter("undecodable"))
                        self._refuse(error, record, refused, first)
                    except Exception as error:  # a bug this record found: it is dead-lettered, the rest goes on
                        self._refuse(InternalError(f"{where_of(record)}: {type(error).__name__}: {error}"), record,
                                     refused, first)
                    self._uncommitted[partition] = self._positions[partition] = record.offset + 1
        finally:
            policy.tally.flush()
            for (reason, lettered), count in refused.items():  # one line per reason and batch, however many records
                record, message = first[reason]
                self.log.warning("dead-lettered %d record(s), reason %s; the first: %s: %s" if lettered else
                                 "refused %d redriven record(s) again, reason %s, their dead letters stand; the "
                                 "first: %s: %s", count, reason, where_of(record), message,
                                 extra={"count": count, "reason": reason, "topic": record.topic,
                                        "partition": record.partition, "offset": record.offset,
                                        "session": record.key.decode("utf-8", "replace") if record.key else None})

    def _refuse(self, error: DshError, record: Any, refused: collections.Counter[tuple[str, bool]],
                first: dict[str, tuple[Any, str]]) -> None:
        lettered = self.policy.refuse(error, record)
        if not lettered:
            self.policy.tally.add(self._counter("refused-again"))
        refused[error.category, lettered] += 1
        first.setdefault(error.category, (record, error.message[:500]))

    def _counter(self, kind: str) -> Any:
        counter = self._counters.get(kind)
        if counter is None:
            counter = self._counters[kind] = RECORDS.labels(self.name, kind)
        return counter

    # ---------------------------------------------------------- checkpoints

    async def _checkpoint(self, wait: bool = True) -> None:
        """Persist, publish, then commit what the batch covers once every
        record is acknowledged (in the background unless ``wait``)."""
        await self._commit_done()
        if not self._uncommitted:
            return
        self.policy.persist()
        await self.outputs.publish()
        offsets, self._uncommitted = self._uncommitted, {}
        self._committing = asyncio.create_task(self._flush_and_commit(offsets))
        if wait:
            await self._commit_done()

    async def _flush_and_commit(self, offsets: dict[TopicPartition, int]) -> None:
        await self.outputs.flush()
        if not await self.outputs.commit(offsets):
            # The group gave these partitions to another member while this one
            # was busy (its session expired): their new owner reads the
            # uncommitted records again, and what was applied is a duplicate
            # there. This member rejoins; it does not stop.
            self.log.warning("offsets of %s not committed, the group moved on", _numbers(set(offsets)),
                             extra={"reason": "group-moved-on", **_fields(set(offsets))})
            return
        COMMITS.labels(self.name).inc()
        self.policy.committed(offsets)

    async def _commit_done(self) -> None:
        """Wait for the last checkpoint's commit; its failure is raised here."""
        committing, self._committing = self._committing, None
        if committing is not None:
            await committing

    # ----------------------------------------------------------- rebalances

    async def _revoke(self, partitions: set[TopicPartition]) -> None:
        if partitions:
            self.log.info("revoked partitions %s (after their last checkpoint)", _numbers(partitions),
                          extra=_fields(partitions))
        try:
            await self._checkpoint()
            await self.policy.revoked(partitions)
            await self.outputs.revoked(partitions)
        finally:
            for partition in partitions:
                self._positions.pop(partition, None)
                self._ends.pop(partition, None)
                with contextlib.suppress(KeyError):
                    LAG.remove(self.name, str(partition.partition))

    async def _assign(self, partitions: set[TopicPartition]) -> None:
        assert self.consumer is not None
        await self.outputs.assigned(partitions)  # fences previous owners before their offsets are read
        await self.policy.assigned(partitions, self.consumer.committed)
        await self._start_positions(partitions)
        self._ends.update(await self.consumer.end_offsets(list(partitions)))
        self._behind = True
        behind = self._update_lag()
        self.log.info("assigned partitions %s: %d record(s) to read", _numbers(partitions), behind or 0,
                      extra={"count": behind, **_fields(partitions)})

    async def _start_positions(self, partitions: set[TopicPartition]) -> None:
        """Where reading each assigned partition starts (its committed
        offset, else its beginning), so its lag shows from the first fetch
        on, not only once records of it were handled."""
        assert self.consumer is not None
        fresh = []
        for partition in partitions:
            committed = await self.consumer.committed(partition)
            if committed is None:
                fresh.append(partition)
            else:
                self._positions[partition] = committed
        if fresh:  # a group without offsets starts where start_from says
            start = (self.consumer.end_offsets if self.config.start_from == "latest"
                     else self.consumer.beginning_offsets)
            self._positions.update(await start(fresh))

    def _update_lag(self) -> int | None:
        """Set each assigned partition's lag: its end offset (as the last
        fetch answered, else as asked at assignment) less its position.
        Returns the records behind in all, ``None`` while an end or a
        position is unknown."""
        assert self.consumer is not None
        behind: int | None = 0
        assigned = self.consumer.assignment()
        answered = [self.consumer.last_poll_timestamp(tp) for tp in assigned]
        newest = max((stamp for stamp in answered if stamp is not None), default=None)
        self._last_answer = None if newest is None else newest / 1000
        for partition in assigned:
            end = self.consumer.highwater(partition)
            if end is None:
                end = self._ends.get(partition)
            position = self._positions.get(partition)
            if end is None or position is None:
                behind = None
                continue
            lag = max(0, end - position)
            LAG.labels(self.name, str(partition.partition)).set(lag)
            if behind is not None:
                behind += lag
        return behind

    def _note_progress(self) -> None:
        """After each poll: the lag, and "caught up" once since the
        assignment, when every assigned partition is read to its end."""
        if self._update_lag() == 0 and self._behind and self.assignment():
            self._behind = False
            self.log.info("caught up: every assigned partition read to its end",
                          extra={"topic": self.config.topics.events})


def _fields(partitions: set[TopicPartition]) -> dict[str, Any]:
    """The log fields of a line about ``partitions`` (of one topic)."""
    return {"topic": min((tp.topic for tp in partitions), default=None),
            "partitions": sorted(tp.partition for tp in partitions)}


def _numbers(partitions: set[TopicPartition]) -> str:
    """``topic [0, 1, 5]`` for each topic."""
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return "; ".join(f"{topic} {numbers}" for topic, numbers in by_topic.items()) or "none"
