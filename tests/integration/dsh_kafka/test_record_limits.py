"""The events topic bounds records after decompression: the broker inflates
every batch a producer sends and refuses one over the limit, so no consumer
ever inflates a compressed bomb or takes a record over the limit."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError

from dsh_core.errors import PipelineError
from dsh_kafka.admin import ensure_topics, prepare_topics
from dsh_kafka.clients import make_admin, make_producer
from dsh_kafka.config import SERVICE_PRODUCER
from dsh_kafka.records import SessionRecord
from dsh_kafka.topics import MAX_MESSAGE_BYTES, TopicNames, TopicSpec

pytestmark = pytest.mark.kafka


async def _send_batch(producer: AIOKafkaProducer, topic: str, values: list[bytes]) -> str:
    batch = producer.create_batch()
    for value in values:
        assert batch.append(key=b"hostile", value=value, timestamp=None) is not None
    try:
        await (await producer.send_batch(batch, topic, partition=0))
    except MessageSizeTooLargeError:
        return "refused"
    return "accepted"


def test_the_broker_refuses_a_batch_over_the_limit_once_inflated(kafka, topics):
    names = topics(partitions=1)

    async def scenario() -> dict[str, str]:
        # A hostile worker: zstd, and no client-side limits of its own.
        hostile = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, compression_type="zstd",
                                   max_request_size=1 << 30, max_batch_size=1 << 30)
        await hostile.start()
        try:
            outcomes = {
                "48 MiB record": await _send_batch(hostile, names.events, [b"x" * (48 << 20)]),
                "4000 records of 10 KiB": await _send_batch(hostile, names.events,
                                                            [bytes([65 + i % 26]) * 10240 for i in range(4000)]),
            }
        finally:
            await hostile.stop()
        honest = make_producer(kafka, SERVICE_PRODUCER)
        await honest.start()
        try:  # the largest record the pipeline sends still fits
            record = SessionRecord("s", "record", 0, 1, b"y" * (MAX_MESSAGE_BYTES - 200))
            await (await honest.send(names.events, key=record.key, value=record.value, headers=record.headers))
            outcomes["largest honest record"] = "accepted"
        finally:
            await honest.stop()
        return outcomes

    assert asyncio.run(scenario()) == {"48 MiB record": "refused", "4000 records of 10 KiB": "refused",
                                       "largest honest record": "accepted"}


def test_an_events_topic_keeping_producer_compression_is_refused(kafka):
    names = TopicNames.with_prefix("compressed.")

    async def scenario() -> None:
        admin = make_admin(kafka)
        await admin.start()
        try:
            await ensure_topics(admin, [TopicSpec(names.events, 2, {"compression.type": "producer"})])
        finally:
            await admin.close()
        await prepare_topics(kafka, names, 2)

    with pytest.raises(PipelineError, match=rf"topic {names.events} has compression.type=producer, expected "
                                            r"uncompressed \(kafka-configs --alter .* --add-config "
                                            r"compression.type=uncompressed sets it\)"):
        asyncio.run(scenario())
