"""The publisher: session events into ``dsh.session-events``, in seq order.

An idempotent, ``acks=all`` aiokafka producer keyed by session id, so one
partition holds each session in order. Every call enqueues without waiting;
:meth:`Publisher.flush` is the durability barrier (await it at turn end, as
dsh flushes its session file): it returns once everything sent so far is
acknowledged, or raises the first delivery failure. Nothing fails silently.

While the cluster cannot take records (fewer copies in sync than
``min.insync.replicas``, no leader) the publisher waits, and resumes when
it can: the Kafka client retries without a limit. The wait has a deadline,
:attr:`ProducerSettings.delivery_timeout_s`: a flush whose records are
not acknowledged by then, and a send that found no room by then (it learns
so at the client's request timeout, which is at most the deadline), raise
:class:`DeliveryTimeoutError`, and the publisher stops: what is still
queued is dropped, so a caller's checkpoint keeps only what was
acknowledged (each send returns its record's delivery to tell which).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import replace
from enum import Enum
from functools import partial
from typing import Any, Iterable, Sequence

from aiokafka.errors import KafkaError, KafkaTimeoutError
from prometheus_client import Counter, Histogram

from dsh_core.errors import PipelineError
from dsh_kafka.errors import DeliveryTimeoutError, RecordTooLargeError
from dsh_core.events import Event
from dsh_kafka.clients import AUTHORIZATION_ERRORS, make_producer, undelivered
from dsh_kafka.config import KafkaConfig, ProducerSettings
from dsh_kafka.records import (
    KIND_ATTESTATION,
    KIND_WIRE,
    KIND_HEADER,
    KIND_RECORD,
    Attestation,
    SessionRecord,
    attestation_record,
    header_record,
    records_for_batch,
)
from dsh_kafka.topics import TopicNames
from dsh_core.request import build_request, request_digest
from dsh_core.session_header import SessionHeader

__all__ = ["Publisher", "acknowledged"]

RECORDS = Counter("dsh_publisher_records_total", "Records handed to Kafka, by kind.", ["kind"])
BYTES = Counter("dsh_publisher_bytes_total", "Record value bytes handed to Kafka, by kind.", ["kind"])
EVENTS = Counter("dsh_publisher_events_total", "Session events published (packed rows count each member).")
SEND_SECONDS = Histogram("dsh_publisher_send_seconds", "From send to broker acknowledgement (every 16th record).",
                         buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10))
ERRORS = Counter("dsh_publisher_errors_total", "Records that failed, by error class.", ["error"])
_BY_KIND = {kind: (RECORDS.labels(kind), BYTES.labels(kind)) for kind in (KIND_HEADER, KIND_RECORD, KIND_ATTESTATION, KIND_WIRE)}
_LATENCY_SAMPLE = 16  # the send-latency histogram observes every 16th record
# Pending deliveries are checked (and metrics published) after this many
# records or value bytes, whichever comes first: until then a sent record is
# kept, so the bytes bound what the publisher holds of large records.
_SETTLE_EVERY = 8192
_SETTLE_BYTES = 32 << 20


def _observe_latency(started: float, future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        SEND_SECONDS.observe(time.perf_counter() - started)

# Headers and key never add this much: only a value this close to the limit
# needs the exact envelope size computed.
_ENVELOPE_ALLOWANCE = 4096


def acknowledged(delivery: object) -> bool:
    """Whether ``delivery`` (what :meth:`Publisher.send` returned) is a
    record the cluster acknowledged."""
    return isinstance(delivery, asyncio.Future) and delivery.done() and not delivery.cancelled() and (
        delivery.exception() is None)


async def _abandon(producer: Any, error: BaseException) -> None:
    """Make an aiokafka producer give up what it holds, which it has no
    public way to do (with idempotence it retries without end): its sender
    stops first (its requests in flight end: answered, or at their request
    timeout), then every record it holds fails with ``error``, so stopping
    it waits for nothing."""
    sender = producer._sender.sender_task
    if sender is not None and not sender.done():
        sender.cancel()
        await asyncio.wait([sender])
    accumulator = producer._message_accumulator
    # A batch sent before and queued again for a retry leaves the in-flight
    # set when it fails: it must be in it then, or its callback raises.
    accumulator._pending_batches.update(batch for batches in accumulator._batches.values() for batch in batches)
    held = list(accumulator._pending_batches)
    accumulator.fail_all(error)
    for batch in held:  # failed as a whole by the error the publisher raises: retrieved
        for future in (batch.future, batch._drain_waiter):
            if future.done() and not future.cancelled():
                future.exception()


class _State(Enum):
    NEW = "new"
    RUNNING = "running"
    GAVE_UP = "stopped at its delivery deadline"
    CLOSED = "closed"


class Publisher:
    """Async context manager publishing session records to Kafka."""

    def __init__(self, kafka: KafkaConfig, topics: TopicNames = TopicNames(),
                 settings: ProducerSettings = ProducerSettings()) -> None:
        self.kafka = kafka
        self.topics = topics
        self.settings = settings
        self._producer: Any = None
        # (delivery, record) since the last settle, then those still in flight
        self._unsettled: list[tuple[asyncio.Future, SessionRecord]] = []
        self._unsettled_bytes = 0
        self._pending: list[tuple[asyncio.Future, SessionRecord]] = []
        self._failures: list[BaseException] = []
        self._writers: dict[str, str] = {}  # session id -> the writer of the header published for it
        self._state = _State.NEW
        self._gave_up: DeliveryTimeoutError | None = None
        self._abandoning: asyncio.Future[None] | None = None  # the client giving up what it holds, once

    async def __aenter__(self) -> "Publisher":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._state is not _State.NEW:
            raise PipelineError(f"publisher is {self._state.value}; start it once")
        # the client's own waits (room, metadata) end within the delivery deadline
        self._producer = make_producer(self.kafka, replace(self.settings, request_timeout_ms=min(
            self.settings.request_timeout_ms, round(self.settings.delivery_timeout_s * 1000))))
        try:
            await self._producer.start()
        except AUTHORIZATION_ERRORS as error:  # an idempotent producer's id needs Write on a topic
            await self._producer.stop()
            raise undelivered(f"the publisher to {self.topics.events} could not start", error) from error
        self._state = _State.RUNNING

    async def close(self) -> None:
        """Flush what is pending, then stop the producer (idempotent; the
        producer is stopped even when the flush fails)."""
        state, self._state = self._state, _State.CLOSED
        if state is _State.GAVE_UP:  # what the client held has failed: stopping does not wait for the cluster
            if self._abandoning is not None:
                await asyncio.shield(self._abandoning)
            await self._producer.stop()
        elif state is _State.RUNNING:
            try:
                await self.flush()
            finally:
                await self._producer.stop()

    # ------------------------------------------------------------ sending

    async def send(self, record: SessionRecord) -> asyncio.Future[Any] | None:
        """Enqueue one record; returns its delivery (done once the cluster
        acknowledged it). :meth:`flush` confirms it, or raises."""
        return await self.send_many((record,))

    async def send_many(self, records: Sequence[SessionRecord]) -> asyncio.Future[Any] | None:
        """Enqueue records in order; returns the last one's delivery. Every
        record is checked against the topic's size limit before any of them
        is sent."""
        if self._gave_up is not None:
            raise self._gave_up
        if self._state is not _State.RUNNING:
            first = records[0] if records else None
            raise PipelineError(f"publisher is {self._state.value}: cannot send "
                                + (f"{first.kind} of session {first.session_id!r} seq {first.seq}" if first else "records"))
        limit = self.settings.max_record_bytes
        for record in records:
            if len(record.value) + _ENVELOPE_ALLOWANCE > limit and record.size > limit:
                ERRORS.labels("RecordTooLargeError").inc()
                raise RecordTooLargeError(
                    f"session {record.session_id!r} seq {record.seq}: a {record.size}-byte {record.kind} exceeds the "
                    f"{limit}-byte limit of topic {self.topics.events}; nothing was sent")
        topic, unsettled = self.topics.events, self._unsettled
        delivery = None
        for record in records:
            try:
                delivery = await self._queue(record)
            except DeliveryTimeoutError:
                raise
            except KafkaError as error:
                ERRORS.labels(type(error).__name__).inc()
                raise undelivered(f"session {record.session_id!r} seq {record.seq}: {record.kind} could not be sent "
                                  f"to {topic}", error) from error
            unsettled.append((delivery, record))
            self._unsettled_bytes += len(record.value)
            if len(unsettled) % _LATENCY_SAMPLE == 0:  # latency of every Nth record
                delivery.add_done_callback(partial(_observe_latency, time.perf_counter()))
            if len(unsettled) >= _SETTLE_EVERY or self._unsettled_bytes >= _SETTLE_BYTES:
                self._settle()
                unsettled = self._unsettled
        return delivery

    async def _queue(self, record: SessionRecord) -> asyncio.Future[Any]:
        """Hand ``record`` to the client. It waits for room (its buffer is
        full while the cluster does not acknowledge) or for the topic's
        metadata up to its request timeout, at most the delivery deadline;
        past the deadline the publisher gives up. (One timer per record
        would cost more than the send.)"""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            try:
                return await self._producer.send(self.topics.events, key=record.key, value=record.value,
                                                 headers=record.headers)
            except KafkaTimeoutError as error:  # past the deadline, or failed by the publisher giving up
                if self._gave_up is not None or loop.time() - started >= self.settings.delivery_timeout_s:
                    raise await self._give_up(f"session {record.session_id!r} seq {record.seq}: {record.kind} "
                                              f"could not be sent to {self.topics.events}", error) from error

    async def _give_up(self, what: str, error: BaseException | None) -> DeliveryTimeoutError:
        """The publisher stops: what it still holds fails (the client's
        queue included, so closing does not wait for the cluster). Callers
        at the same time (concurrent sends, a flush) share one give-up and
        its error: the client is abandoned once (a second stop of its
        sender would orphan its requests in flight)."""
        if self._gave_up is None:
            ERRORS.labels("DeliveryTimeoutError").inc()
            self._state = _State.GAVE_UP
            cause = f" ({type(error).__name__}: {error})" if error is not None and str(error) else ""
            self._gave_up = DeliveryTimeoutError(
                f"{what} within the {self.settings.delivery_timeout_s:g} s delivery deadline (--delivery-timeout)"
                f"{cause}: too few of the cluster's brokers are up for the topic's min.insync.replicas, or its "
                "partitions have no leader; what was acknowledged before is kept")
            self._abandoning = asyncio.ensure_future(_abandon(self._producer, KafkaTimeoutError(
                f"abandoned after the {self.settings.delivery_timeout_s:g} s delivery deadline")))
        assert self._abandoning is not None
        await asyncio.shield(self._abandoning)
        for delivery, _ in self._pending + self._unsettled:
            if delivery.done() and not delivery.cancelled():
                delivery.exception()  # retrieved: failed as a whole by the error raised
        self._pending, self._unsettled, self._unsettled_bytes, self._failures = [], [], 0, []
        return self._gave_up

    def _settle(self) -> None:
        """Count the records sent since the last settle into the metrics,
        then drop delivered ones from the pending list, keeping failures."""
        counts: collections.Counter[str] = collections.Counter()
        sizes: collections.Counter[str] = collections.Counter()
        events = 0
        for _, record in self._unsettled:
            counts[record.kind] += 1
            sizes[record.kind] += len(record.value)
            events += record.count
        for kind, count in counts.items():
            records, sent_bytes = _BY_KIND[kind]
            records.inc(count)
            sent_bytes.inc(sizes[kind])
        EVENTS.inc(events)
        self._pending.extend(self._unsettled)
        self._unsettled, self._unsettled_bytes = [], 0
        still = []
        for delivery, record in self._pending:
            if not delivery.done():
                still.append((delivery, record))
            elif delivery.cancelled() or delivery.exception() is not None:
                error = None if delivery.cancelled() else delivery.exception()
                ERRORS.labels(type(error).__name__ if error else "Cancelled").inc()
                failure = undelivered(f"session {record.session_id!r} seq {record.seq}: {record.kind} was not "
                                      f"acknowledged by {self.topics.events}", error)
                failure.__cause__ = error
                self._failures.append(failure)
        self._pending = still

    async def flush(self) -> None:
        """The durability barrier: every record sent so far is acknowledged
        when this returns; otherwise the first failure is raised."""
        if self._gave_up is not None:
            raise self._gave_up
        if self._producer is not None and (self._pending or self._unsettled):
            waiting = self._pending + self._unsettled
            _, late = await asyncio.wait([delivery for delivery, _ in waiting],
                                         timeout=self.settings.delivery_timeout_s)
            if late:
                first = next(record for delivery, record in waiting if delivery in late)
                raise await self._give_up(f"{len(late)} records, the first session {first.session_id!r} seq "
                                          f"{first.seq}, were not acknowledged by {self.topics.events}", None)
        self._settle()
        if self._failures:
            failure, self._failures = self._failures[0], []
            raise failure

    # ------------------------------------------------------- record kinds

    async def publish_header(self, header: SessionHeader) -> None:
        """The session's header; its later records carry its writer."""
        record = header_record(header)
        self._writers[header.id] = record.writer
        await self.send(record)

    async def publish_batch(self, session_id: str, events: Iterable[Event | dict[str, Any]]) -> None:
        """One append batch, delta runs packed into rows as dsh stores them.
        Every record is checked against the size limit before any is sent."""
        records = records_for_batch(session_id, events, writer=self._writers.get(session_id, ""))
        for record in records:
            if len(record.value) + _ENVELOPE_ALLOWANCE > self.settings.max_record_bytes and (
                record.size > self.settings.max_record_bytes):
                await self.send(record)  # raises RecordTooLargeError, names the record
        for record in records:
            await self.send(record)

    async def publish_event(self, session_id: str, event: Event | dict[str, Any]) -> None:
        """One appended event as its own record."""
        await self.publish_batch(session_id, [event])

    async def attest_request(self, session_id: str, turn: Any, step: Any, boundary_seq: int,
                             request: dict[str, Any]) -> Attestation:
        """Publish the digest of a request actually sent, right after the
        events below ``boundary_seq`` (same key, so the auditor has them)."""
        attestation = Attestation(turn, step, boundary_seq, request_digest(request))
        await self.send(attestation_record(session_id, attestation))
        return attestation

    async def attest_prefix(self, session_id: str, turn: Any, step: Any, boundary_seq: int, header: Any,
                            messages: list[Any]) -> Attestation:
        """:meth:`attest_request` of the request a loop builds from a prefix."""
        return await self.attest_request(session_id, turn, step, boundary_seq, build_request(header, messages, session_id))
