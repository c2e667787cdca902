"""The shared consumer runner: group membership, batches, errors, commits.

A service subclasses :class:`ConsumerService` and implements
:meth:`~ConsumerService.handle` (one decoded record) and
:meth:`~ConsumerService.persist` (make the batch's effects durable). The
runner guarantees:

* records of a partition are handled in offset order, in ``getmany`` batches;
* a record that cannot be decoded or that a service refuses goes through
  :meth:`~ConsumerService.on_error` — by default to ``dsh.dead-letter`` with
  the reason and its ``topic[partition]@offset`` — and is counted; the
  service keeps going; nothing is skipped silently;
* offsets are committed only after :meth:`persist` returned and every record
  the service produced (dead letters, view heads) was acknowledged — never on
  a failure; auto-commit is off; on revoke the service persists and commits
  before the partitions go; on assign it may load state lazily;
* that acknowledgement wait and the commit run while the next batch is
  fetched and handled; the next checkpoint waits for them, so commits stay
  in order and a failure still stops the service;
* SIGTERM (``stop``) drains: the current batch finishes, is persisted and
  committed, then everything closes;
* a rebalance callback that fails (the revoke checkpoint, a state rebuild
  on assign) stops the service with that error before another record is
  handled; aiokafka alone would log it and carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from typing import Any, Iterator

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from prometheus_client import Counter, Gauge, Histogram

from dsh_core.errors import DecodeError, DshError, HeldLimitError
from dsh_kafka.clients import make_consumer, make_producer
from dsh_kafka.config import SERVICE_PRODUCER, ConsumerSettings, KafkaConfig
from dsh_kafka.records import KafkaRecord, SessionRecord, decode_kafka_record
from dsh_kafka.topics import TopicNames

__all__ = ["ConsumerService", "RECORDS", "DEAD_LETTERS", "HELD_LIMIT", "HOT_SESSIONS", "held_limit_error"]

RECORDS = Counter("dsh_consumer_records_total", "Records consumed, by service and kind.", ["service", "kind"])
DEAD_LETTERS = Counter("dsh_consumer_dead_letters_total", "Records sent to the dead-letter topic, by service and reason.",
                       ["service", "reason"])
BATCH_RECORDS = Histogram("dsh_consumer_batch_records", "Records per poll batch.", ["service"],
                          buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000))
BATCH_SECONDS = Histogram("dsh_consumer_batch_seconds", "Time to handle and persist one batch (its commit overlaps the next).", ["service"],
                          buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
LAG = Gauge("dsh_consumer_lag_records", "Records behind the partition's end offset.", ["service", "partition"])
COMMITS = Counter("dsh_consumer_commits_total", "Offset commits after durable effects.", ["service"])


#: Records a service keeps per session while it waits for a missing seq.
HELD_LIMIT = 10_000
#: Sessions a service keeps in memory by default (its LRU).
HOT_SESSIONS = 20_000


def held_limit_error(session_id: str, waiting_for: int, seq: int) -> HeldLimitError:
    """The refusal of a record beyond :data:`HELD_LIMIT`."""
    return HeldLimitError(session_id, waiting_for, seq, HELD_LIMIT)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: "ConsumerService") -> None:
        self.service = service

    # aiokafka runs these in its coordinator task, which may interleave with
    # batch handling at any await: the service lock serializes them. aiokafka
    # logs a listener's exception and carries on with the rebalance, so a
    # failure is kept for the run loop, which stops the service with it
    # before handling another record (state after a failed checkpoint or
    # rebuild cannot be trusted).
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self.service.lock:
            if self.service.rebalance_failure is None:
                with self._kept():
                    await self.service._checkpoint()
                    await self.service.on_revoke(set(revoked))
            for partition in revoked:
                self.service._consumed.pop(partition, None)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self.service.lock:
            if self.service.rebalance_failure is None:
                with self._kept():
                    await self.service.on_assign(set(assigned))

    @contextlib.contextmanager
    def _kept(self) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            self.service.rebalance_failure = error
            raise


class ConsumerService(ABC):
    """Base of the projector, auditor and archiver."""

    service = "consumer"

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, settings: ConsumerSettings) -> None:
        self.kafka = kafka
        self.topics = topics
        self.settings = settings
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self._positions: dict[TopicPartition, int] = {}  # next offset to commit, per partition
        self._consumed: dict[TopicPartition, int] = {}  # next offset to read, per partition (for lag)
        self.last_poll = time.monotonic()
        self.healthy = False
        self.drained = False  # the last run ended with everything handled persisted and committed
        self.lock = asyncio.Lock()  # batch handling vs rebalance callbacks
        self._record_counters: dict[str, Any] = {}
        self._tally: dict[Any, float] = {}  # counter child -> increments this batch
        self._committing: asyncio.Task[None] | None = None  # the last checkpoint's flush and commit
        self.rebalance_failure: Exception | None = None  # raised by the run loop (see _Rebalance)

    # ------------------------------------------------------------ the hooks

    @abstractmethod
    async def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        """Apply one record (raise a :class:`DshError` to refuse it)."""

    @abstractmethod
    async def persist(self) -> None:
        """Make every effect of the records handled so far durable."""

    async def on_assign(self, partitions: set[TopicPartition]) -> None:
        """Partitions arrived (state may load lazily)."""

    async def on_revoke(self, partitions: set[TopicPartition]) -> None:
        """Partitions left, after their effects were persisted and committed."""

    async def open(self) -> None:
        """Resources the service needs before the first batch."""

    async def close(self) -> None:
        """Release resources (idempotent)."""

    def make_producer(self) -> AIOKafkaProducer | None:
        """The producer of the service's outputs (dead letters, view heads),
        flushed before each commit; ``None`` for a service that keeps its own."""
        return make_producer(self.kafka, SERVICE_PRODUCER)

    async def on_error(self, error: DshError, record: KafkaRecord) -> None:
        """The error policy: dead-letter the record with its reason and
        coordinates, and count it. Override to change it."""
        await self.dead_letter(record, error)

    # -------------------------------------------------------------- helpers

    def count(self, counter: Any, amount: float = 1) -> None:
        """Increment a Prometheus counter (child) once per batch rather than
        per record: the per-call cost of ``inc`` shows in consumer profiles."""
        self._tally[counter] = self._tally.get(counter, 0) + amount

    def _flush_tally(self) -> None:
        tally, self._tally = self._tally, {}
        for counter, amount in tally.items():
            counter.inc(amount)

    async def dead_letter(self, record: KafkaRecord, error: DshError) -> None:
        assert self.producer is not None
        await self.send_dead_letter(self.producer, record, error)

    async def send_dead_letter(self, producer: AIOKafkaProducer, record: KafkaRecord,
                               error: DshError) -> asyncio.Future[Any]:
        """Send the record to the dead-letter topic with its reason and
        coordinates in headers; returns the delivery future."""
        reason = getattr(error, "category", "other")
        headers = list(record.headers or ()) + [
            ("dsh-dlq-service", self.service.encode()), ("dsh-dlq-reason", reason.encode()),
            ("dsh-dlq-error", f"{type(error).__name__}: {error.message}"[:4000].encode()),
            ("dsh-dlq-topic", record.topic.encode()), ("dsh-dlq-partition", str(record.partition).encode()),
            ("dsh-dlq-offset", str(record.offset).encode())]
        delivery = await producer.send(self.topics.dead_letter, key=record.key, value=record.value, headers=headers)
        DEAD_LETTERS.labels(self.service, reason).inc()
        return delivery

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit consumer offsets (the auditor commits inside a transaction)."""
        assert self.consumer is not None
        await self.consumer.commit(offsets)

    async def _checkpoint(self, wait: bool = True) -> None:
        """Persist effects, then commit what they cover once every record
        produced so far is acknowledged (in the background unless ``wait``)."""
        await self._commit_done()
        if not self._positions:
            return
        await self.persist()
        offsets, self._positions = dict(self._positions), {}
        self._committing = asyncio.create_task(self._flush_and_commit(offsets))
        if wait:
            await self._commit_done()

    async def _flush_and_commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.producer is not None:
            await self.producer.flush()
        await self.commit(offsets)
        COMMITS.labels(self.service).inc()

    async def _commit_done(self) -> None:
        """Wait for the last checkpoint's commit; its failure is raised here."""
        committing, self._committing = self._committing, None
        if committing is not None:
            await committing

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        self.producer = self.make_producer()
        if self.producer is not None:
            await self.producer.start()
        self.consumer = make_consumer(self.kafka, self.settings)
        self.consumer.subscribe([self.topics.events], listener=_Rebalance(self))
        await self.open()
        await self.consumer.start()
        self.healthy = True
        try:
            while not stop.is_set():
                batch = await self.consumer.getmany(timeout_ms=250, max_records=self.settings.max_records)
                self._raise_rebalance_failure()
                if self._committing is not None and self._committing.done():
                    await self._commit_done()  # a failed commit stops the service even with no new batch
                self.last_poll = time.monotonic()
                if batch:
                    started = time.perf_counter()
                    async with self.lock:
                        await self._handle_batch(batch)
                        await self._checkpoint(wait=False)
                    BATCH_SECONDS.labels(self.service).observe(time.perf_counter() - started)
                    BATCH_RECORDS.labels(self.service).observe(sum(len(r) for r in batch.values()))
                self._update_lag()
            async with self.lock:
                self._raise_rebalance_failure()
                await self._checkpoint()  # drain: what was handled is persisted and committed
            self.drained = True
        finally:
            self.healthy = False
            if self._committing is not None:  # only when failing: a clean drain awaited it
                self._committing.cancel()
                with contextlib.suppress(BaseException):
                    await self._committing
            try:
                await self.consumer.stop()
            finally:
                try:
                    await self.close()
                finally:
                    if self.producer is not None:
                        await self.producer.stop()

    def _raise_rebalance_failure(self) -> None:
        if self.rebalance_failure is not None:
            raise self.rebalance_failure

    async def _handle_batch(self, batch: dict[TopicPartition, list[Any]]) -> None:
        try:
            for partition, records in batch.items():
                for record in records:
                    try:
                        decoded = decode_kafka_record(record)
                        counter = self._record_counters.get(decoded.kind)
                        if counter is None:
                            counter = self._record_counters[decoded.kind] = RECORDS.labels(self.service, decoded.kind)
                        self.count(counter)
                        await self.handle(record, decoded)
                    except DshError as error:
                        if isinstance(error, DecodeError):
                            self.count(RECORDS.labels(self.service, "undecodable"))
                        await self.on_error(error, record)
                    self._positions[partition] = self._consumed[partition] = record.offset + 1
        finally:
            self._flush_tally()

    def _update_lag(self) -> None:
        assert self.consumer is not None
        for partition in self.consumer.assignment():
            highwater = self.consumer.highwater(partition)
            consumed = self._consumed.get(partition)
            if highwater is not None and consumed is not None:
                LAG.labels(self.service, str(partition.partition)).set(max(0, highwater - consumed))

