"""Exactly-once outputs: one transactional producer per assigned partition.

A partition's findings, dead letters and consumer offsets of each batch are
committed in one Kafka transaction by that partition's own producer
(transactional id ``<group>.<topic>.<partition>``). A member that takes a
partition over initializes that id first, which aborts the previous owner's
open transaction and fences it: a zombie member (one the group already
replaced) can commit nothing more, and stops with :class:`FencedError`.

Transactions begin when a checkpoint publishes, after the previous one
committed (the runtime awaits that commit first), so no record joins the
wrong transaction while the commit of one batch overlaps the next.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from dsh_kafka.errors import FencedError
from dsh_kafka.clients import make_producer
from dsh_kafka.config import SERVICE_PRODUCER, KafkaConfig, Secret
from dsh_kafka.topics import TopicNames

from ..runtime.outputs import OutgoingRecord, Outputs, all_done

__all__ = ["TransactionalOutputs"]


class TransactionalOutputs(Outputs):
    def __init__(self, kafka: KafkaConfig, topics: TopicNames, service: str, group: str,
                 redrive_key: Secret | None = None) -> None:
        super().__init__(topics, service, redrive_key)
        self.kafka = kafka
        self.group = group
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self._open: set[TopicPartition] = set()  # partitions whose transaction has begun
        self._deliveries: list[tuple[TopicPartition, asyncio.Future[Any]]] = []

    def transactional_id(self, partition: TopicPartition) -> str:
        return f"{self.group}.{partition.topic}.{partition.partition}"

    async def start(self, consumer: AIOKafkaConsumer) -> None:
        """Nothing before the first assignment."""

    async def stop(self) -> None:
        await self.revoked(set(self._producers))

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """Initialize each partition's transactional id: this aborts the
        transaction a previous owner left open and fences that owner."""
        async def start(partition: TopicPartition) -> None:
            producer = make_producer(self.kafka, SERVICE_PRODUCER, transactional_id=self.transactional_id(partition))
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producers[partition] = producer
        await all_done(start(p) for p in partitions if p not in self._producers)

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        producers = [self._producers.pop(p) for p in partitions if p in self._producers]
        self._open -= partitions
        await all_done(producer.stop() for producer in producers)

    async def publish(self) -> None:
        by_partition: dict[TopicPartition, list[OutgoingRecord]] = {}
        pending, self.pending = self.pending, []
        for outgoing in pending:
            by_partition.setdefault(TopicPartition(self.topics.events, outgoing[0]), []).append(outgoing)
        await all_done(self._send(partition, records) for partition, records in by_partition.items())

    async def _send(self, partition: TopicPartition, records: list[OutgoingRecord]) -> None:
        with self._fencing(partition):
            producer = await self._transaction(partition)
            for _, topic, key, value, headers in records:
                self._deliveries.append((partition, await producer.send(topic, key=key, value=value,
                                                                    headers=list(headers))))

    async def flush(self) -> None:
        deliveries, self._deliveries = self._deliveries, []
        await all_done(self._delivered(partition, delivery) for partition, delivery in deliveries)

    async def _delivered(self, partition: TopicPartition, delivery: asyncio.Future[Any]) -> None:
        with self._fencing(partition):
            await delivery

    async def commit(self, offsets: dict[TopicPartition, int]) -> bool:
        await all_done(self._commit(partition, offset) for partition, offset in offsets.items())
        return True  # a moved partition fences this member instead (FencedError)

    async def _commit(self, partition: TopicPartition, offset: int) -> None:
        with self._fencing(partition):
            producer = await self._transaction(partition)
            await producer.send_offsets_to_transaction({partition: offset}, self.group)
            await producer.commit_transaction()
        self._open.discard(partition)

    async def _transaction(self, partition: TopicPartition) -> AIOKafkaProducer:
        """The partition's producer, inside a transaction."""
        producer = self._producers[partition]
        if partition not in self._open:
            await producer.begin_transaction()
            self._open.add(partition)
        return producer

    @contextlib.contextmanager
    def _fencing(self, partition: TopicPartition) -> Iterator[None]:
        try:
            yield
        except ProducerFenced as error:
            raise FencedError(f"{partition.topic}[{partition.partition}]: transactional id "
                              f"{self.transactional_id(partition)!r} was taken over by a newer member; this member "
                              "was replaced in the group and stops (its open transaction is aborted)") from error
