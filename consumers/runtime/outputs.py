"""Where a consumer service's records go (dead letters, view heads,
findings) and how its offsets are committed.

A service hands records to :meth:`Outputs.send` while it handles a batch;
they leave at the batch's checkpoint (:meth:`~Outputs.publish`), are
acknowledged (:meth:`~Outputs.flush`) and only then are the batch's offsets
committed (:meth:`~Outputs.commit`). :class:`ProducerOutputs` is one
idempotent producer and the group's offset commit; the auditor's
transactional outputs commit both in one transaction per partition.
"""

from __future__ import annotations

import asyncio
import hashlib
from abc import ABC, abstractmethod
from typing import Any, Awaitable, Iterable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError

from dsh_core.errors import DeletedSessionError, DshError, PipelineError
from dsh_kafka.clients import make_producer, undelivered
from dsh_kafka.config import SERVICE_PRODUCER, KafkaConfig, Secret
from dsh_kafka.records import KafkaRecord
from dsh_kafka.topics import MAX_MESSAGE_BYTES, TopicNames

from .metrics import DEAD_LETTERS
from .redrive_mark import Source, redriven_from

__all__ = ["DEAD_LETTER_VALUE_BYTES", "Outputs", "OutgoingRecord", "ProducerOutputs", "all_done", "dead_letter"]

Headers = Sequence[tuple[str, bytes | None]]
#: ``(source partition, topic, key, value, headers)``
OutgoingRecord = tuple[int, str, bytes | None, bytes | None, Headers]


#: Bytes of the original value a dead letter carries; the rest of the topic's
#: limit is room for its headers.
DEAD_LETTER_VALUE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
#: Bytes of the original's own headers a dead letter copies.
_ORIGINAL_HEADER_BYTES = 16 * 1024


def dead_letter(record: KafkaRecord, error: DshError, service: str, redriven: tuple[Source, frozenset[str]] | None = None
                ) -> tuple[bytes | None, list[tuple[str, bytes | None]]]:
    """The dead letter of ``record``: its value and headers plus why and where
    it was refused (a redriven record, ``redriven`` its verified mark: where
    it was first read, so all the letters of one record share its
    coordinates). The letter of a deleted
    session's record keeps none of its value (only its size and SHA-256):
    what was erased is not copied. It always fits the topic: an original over
    :data:`DEAD_LETTER_VALUE_BYTES` is cut, with its size and SHA-256, and
    oversized original headers are left out, with their size. An original
    header's null value stays null (Kafka allows it)."""
    value = record.value
    original = [(key, _header_value(item)) for key, item in record.headers or ()]
    headers: list[tuple[str, bytes | None]] = []
    original_size = sum(len(key) + len(item or b"") for key, item in original)
    if original_size <= _ORIGINAL_HEADER_BYTES:
        headers += original
    else:
        headers.append(("dsh-dlq-headers-left-out", str(original_size).encode()))
    kept = 0 if isinstance(error, DeletedSessionError) else DEAD_LETTER_VALUE_BYTES
    if value is not None and len(value) > kept:
        headers += [("dsh-dlq-value-size", str(len(value)).encode()),
                    ("dsh-dlq-value-sha256", hashlib.sha256(value).hexdigest().encode())]
        value = value[:kept]
    topic, partition, offset = redriven[0] if redriven else (record.topic, record.partition, record.offset)
    headers += [
        ("dsh-dlq-service", service.encode()), ("dsh-dlq-reason", error.category.encode()),
        ("dsh-dlq-error", f"{type(error).__name__}: {error.message}"[:4000].encode("utf-8", "replace")),
        ("dsh-dlq-topic", topic.encode()), ("dsh-dlq-partition", str(partition).encode()),
        ("dsh-dlq-offset", str(offset).encode())]
    return value, headers


def _header_value(value: object) -> bytes | None:
    """A fetched header's value as Kafka carries it: bytes, or null."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8", "backslashreplace")


async def all_done(awaitables: Iterable[Awaitable[Any]]) -> None:
    """Await every one (none is left running or unretrieved), then raise the
    first failure."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure


class Outputs(ABC):
    """A service's outgoing records and offset commits."""

    def __init__(self, topics: TopicNames, service: str, redrive_key: Secret | None = None) -> None:
        self.topics = topics
        self.service = service
        self.redrive_key = redrive_key  # verifies the marks of redriven records (none believed without it)
        self.pending: list[OutgoingRecord] = []

    def send(self, source: int, topic: str, key: bytes | None, value: bytes | None, headers: Headers = ()) -> None:
        """Queue a record caused by a record of partition ``source``."""
        self.pending.append((source, topic, key, value, headers))

    def dead_letter(self, record: KafkaRecord, error: DshError) -> bool:
        """Queue ``record`` for the dead-letter topic with its reason and
        coordinates, and count it; ``False`` (nothing queued) for a redriven
        record refused for a reason it was dead-lettered for before: that
        letter exists already, and a redrive run again (from cron) must not
        add one per service each time. Only a mark signed with the redrive
        key counts (:mod:`.redrive_mark`): a forged one hides nothing."""
        redriven = redriven_from(self.redrive_key, record.key, record.value,
                                 [(name, _header_value(item)) for name, item in record.headers or ()])
        if redriven is not None and error.category in redriven[1]:
            return False
        self.send(record.partition, self.topics.dead_letter, record.key,
                  *dead_letter(record, error, self.service, redriven))
        DEAD_LETTERS.labels(self.service, error.category).inc()
        return True

    @abstractmethod
    async def start(self, consumer: AIOKafkaConsumer) -> None:
        """Before the first batch (``consumer`` commits the group's offsets)."""

    @abstractmethod
    async def stop(self) -> None:
        """Release every client (idempotent)."""

    @abstractmethod
    async def publish(self) -> None:
        """Send the queued records (a failure to send fails the checkpoint)."""

    @abstractmethod
    async def flush(self) -> None:
        """Wait until every published record is acknowledged; raises
        :class:`DeliveryError` if one was not."""

    @abstractmethod
    async def commit(self, offsets: dict[TopicPartition, int]) -> bool:
        """Commit the group's offsets (after :meth:`flush`); ``False`` when
        the group refused them because it gave the partitions to another
        member meanwhile."""

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """Partitions arrived (before the service rebuilds their state)."""

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        """Partitions left (after their last commit)."""


class ProducerOutputs(Outputs):
    """One idempotent producer; offsets committed by the group's consumer."""

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, service: str, redrive_key: Secret | None = None
                 ) -> None:
        super().__init__(topics, service, redrive_key)
        self.kafka = kafka
        self.producer: AIOKafkaProducer | None = None  # made in start(), inside the service's event loop
        self.consumer: AIOKafkaConsumer | None = None
        self._deliveries: list[tuple[str, asyncio.Future[Any]]] = []

    async def start(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.producer = make_producer(self.kafka, SERVICE_PRODUCER)
        await self.producer.start()

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()

    def _started(self) -> AIOKafkaProducer:
        if self.producer is None:
            raise PipelineError(f"the {self.service} outputs are used before start()")
        return self.producer

    async def publish(self) -> None:
        pending, self.pending = self.pending, []
        for _, topic, key, value, headers in pending:
            self._deliveries.append((topic, await self._started().send(topic, key=key, value=value,
                                                                     headers=list(headers))))

    async def flush(self) -> None:
        deliveries, self._deliveries = self._deliveries, []
        await self._started().flush()
        for topic, delivery in deliveries:
            error = delivery.exception()
            if error is not None:
                raise undelivered(f"{self.service}: a record for {topic} was not acknowledged (nothing of this batch "
                                  "is committed)", error) from error

    async def commit(self, offsets: dict[TopicPartition, int]) -> bool:
        assert self.consumer is not None
        try:
            await self.consumer.commit(offsets)
        except CommitFailedError:  # aiokafka: the group rebalanced past this member's generation
            return False
        return True
