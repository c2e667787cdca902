"""Reading partitions again outside the group, to rebuild state on assignment."""

from __future__ import annotations

from typing import Callable

from aiokafka import TopicPartition

from dsh_kafka.clients import make_consumer
from dsh_kafka.config import ConsumerSettings, KafkaConfig
from dsh_kafka.records import KafkaRecord

__all__ = ["replay"]

#: Records per replay fetch.
_REPLAY_BATCH = 5000


async def replay(kafka: KafkaConfig, ranges: dict[TopicPartition, tuple[int, int]],
                 handle: Callable[[KafkaRecord], None], batch_done: Callable[[], None]) -> None:
    """Hand every record of each partition from ``start`` (inclusive) to
    ``end`` (exclusive) to ``handle``, in offset order, by a consumer in no
    group; ``batch_done`` after each fetch."""
    if not ranges:
        return
    consumer = make_consumer(kafka, ConsumerSettings(group_id=None))
    await consumer.start()
    try:
        for partition, (start, end) in ranges.items():
            consumer.assign([partition])
            consumer.seek(partition, start)
            while await consumer.position(partition) < end:
                batch = await consumer.getmany(partition, timeout_ms=1000, max_records=_REPLAY_BATCH)
                for record in batch.get(partition, ()):
                    if record.offset >= end:
                        break
                    handle(record)
                batch_done()
    finally:
        await consumer.stop()
