"""The publisher: session events into ``dsh.session-events``, in seq order.

An idempotent, ``acks=all`` aiokafka producer keyed by session id, so one
partition holds each session in order. Every call enqueues without waiting;
:meth:`Publisher.flush` is the durability barrier (await it at turn end, as
dsh flushes its session file): it returns once everything sent so far is
acknowledged, or raises the first delivery failure. Nothing fails silently.
"""

from __future__ import annotations

import asyncio
import time
from enum import Enum
from typing import Any, Iterable

from prometheus_client import Counter, Histogram

from dsh_core.errors import PipelineError
from dsh_core.events import Event
from dsh_core.kafka.config import KafkaConfig, ProducerSettings
from dsh_core.kafka.records import (
    Attestation,
    SessionRecord,
    attestation_record,
    header_record,
    records_for_batch,
)
from dsh_core.kafka.topics import TopicNames
from dsh_core.request import build_request, request_digest
from dsh_core.session_header import SessionHeader

__all__ = ["Publisher", "RecordTooLargeError", "DeliveryError"]

RECORDS = Counter("dsh_publisher_records_total", "Records handed to Kafka, by kind.", ["kind"])
BYTES = Counter("dsh_publisher_bytes_total", "Record value bytes handed to Kafka, by kind.", ["kind"])
EVENTS = Counter("dsh_publisher_events_total", "Session events published (packed rows count each member).")
SEND_SECONDS = Histogram("dsh_publisher_send_seconds", "From send to broker acknowledgement.",
                         buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10))
ERRORS = Counter("dsh_publisher_errors_total", "Records that failed, by error class.", ["error"])


class RecordTooLargeError(PipelineError):
    """Raised before sending a record larger than the topic's message limit."""


class DeliveryError(PipelineError):
    """Raised by :meth:`Publisher.flush` when a record was not acknowledged."""

    retriable = True


class _State(Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class Publisher:
    """Async context manager publishing session records to Kafka."""

    def __init__(self, kafka: KafkaConfig, topics: TopicNames = TopicNames(),
                 settings: ProducerSettings = ProducerSettings()) -> None:
        self.kafka = kafka
        self.topics = topics
        self.settings = settings
        self._producer: Any = None
        self._pending: set[asyncio.Future] = set()
        self._failures: list[BaseException] = []
        self._state = _State.NEW

    async def __aenter__(self) -> "Publisher":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer
        if self._state is not _State.NEW:
            raise PipelineError(f"publisher is {self._state.value}; start it once")
        self._producer = AIOKafkaProducer(**self.settings.producer_options(self.kafka))
        await self._producer.start()
        self._state = _State.RUNNING

    async def close(self) -> None:
        """Flush what is pending, then stop the producer (idempotent; the
        producer is stopped even when the flush fails)."""
        if self._state is not _State.RUNNING:
            self._state = _State.CLOSED
            return
        self._state = _State.CLOSED
        try:
            await self.flush()
        finally:
            await self._producer.stop()

    # ------------------------------------------------------------ sending

    async def send(self, record: SessionRecord) -> None:
        """Enqueue one record (its delivery is confirmed by :meth:`flush`)."""
        if self._state is not _State.RUNNING:
            raise PipelineError(f"publisher is {self._state.value}: cannot send {record.kind} of session "
                                f"{record.session_id!r} seq {record.seq}")
        if record.size > self.settings.max_record_bytes:
            ERRORS.labels("RecordTooLargeError").inc()
            raise RecordTooLargeError(
                f"session {record.session_id!r} seq {record.seq}: a {record.size}-byte {record.kind} exceeds the "
                f"{self.settings.max_record_bytes}-byte limit of topic {self.topics.events}; nothing was sent")
        from aiokafka.errors import KafkaError
        started = time.perf_counter()
        try:
            delivery = await self._producer.send(self.topics.events, key=record.key, value=record.value,
                                                 headers=record.headers)
        except KafkaError as error:
            ERRORS.labels(type(error).__name__).inc()
            raise DeliveryError(f"session {record.session_id!r} seq {record.seq}: {record.kind} could not be sent to "
                                f"{self.topics.events}: {type(error).__name__}: {error}",
                                retriable=bool(getattr(error, "retriable", False))) from error
        RECORDS.labels(record.kind).inc()
        BYTES.labels(record.kind).inc(len(record.value))
        EVENTS.inc(record.count)
        self._pending.add(delivery)
        delivery.add_done_callback(lambda future: self._delivered(future, record, started))

    def _delivered(self, future: asyncio.Future, record: SessionRecord, started: float) -> None:
        self._pending.discard(future)
        if future.cancelled():
            self._failures.append(DeliveryError(f"session {record.session_id!r} seq {record.seq}: send was cancelled"))
            return
        error = future.exception()
        if error is None:
            SEND_SECONDS.observe(time.perf_counter() - started)
            return
        ERRORS.labels(type(error).__name__).inc()
        failure = DeliveryError(f"session {record.session_id!r} seq {record.seq}: {record.kind} was not "
                                f"acknowledged by {self.topics.events}: {type(error).__name__}: {error}")
        failure.__cause__ = error
        self._failures.append(failure)

    async def flush(self) -> None:
        """The durability barrier: every record sent so far is acknowledged
        when this returns; otherwise the first failure is raised."""
        if self._producer is not None and self._pending:
            await self._producer.flush()
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self._failures:
            first, self._failures = self._failures[0], []
            raise first

    # ------------------------------------------------------- record kinds

    async def publish_header(self, header: SessionHeader) -> None:
        await self.send(header_record(header))

    async def publish_batch(self, session_id: str, events: Iterable[Event | dict[str, Any]]) -> None:
        """One append batch, delta runs packed into rows as dsh stores them.
        Every record is checked against the size limit before any is sent."""
        records = records_for_batch(session_id, events)
        for record in records:
            if record.size > self.settings.max_record_bytes:
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
