"""Policies driven the way the runtime drives them, without a broker:
records fetched from nowhere, a batch through ConsumerService.handle_batch,
the checkpoint's records kept by recording outputs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from consumers.runtime import ConsumerService, Outputs, Policy
from dsh_kafka.config import KafkaConfig, Secret
from dsh_kafka.records import SessionRecord
from dsh_kafka.topics import TopicNames

KAFKA = KafkaConfig("unused.invalid:9092")  # no client is ever made
NAMES = TopicNames()


@dataclass
class Fetched:
    """A record as a consumer fetches it."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    offset: int
    topic: str = NAMES.events
    partition: int = 0
    timestamp: int = 0


@dataclass
class RecordingOutputs(Outputs):
    """Outputs that keep what a checkpoint would send."""

    sent: list[tuple[str, bytes | None, bytes | None, dict]] = field(default_factory=list)
    key: Secret | None = None  # the redrive key

    def __post_init__(self) -> None:
        super().__init__(NAMES, "test", self.key)

    async def start(self, consumer) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def publish(self) -> None:
        pending, self.pending = self.pending, []
        self.sent += [(topic, key, value, dict(headers)) for _, topic, key, value, headers in pending]

    async def flush(self) -> None:
        pass

    async def commit(self, offsets) -> bool:
        return True

    def on(self, topic: str) -> list[tuple[bytes | None, bytes | None, dict]]:
        return [(key, value, headers) for sent_to, key, value, headers in self.sent if sent_to == topic]


def fetched(records: list[SessionRecord]) -> list[Fetched]:
    return [Fetched(r.key, r.value, r.headers, offset) for offset, r in enumerate(records)]


def run_batch(policy: Policy, records: list[Fetched], redrive_key: Secret | None = None) -> RecordingOutputs:
    """What the runtime does with one batch, then its checkpoint."""
    outputs = RecordingOutputs(key=redrive_key)
    service = ConsumerService(policy.config, policy, outputs)

    async def batch() -> None:
        await policy.open(outputs)
        service.handle_batch({TopicPartition(NAMES.events, 0): records})
        policy.persist()
        await outputs.publish()
        policy.committed({})
        await policy.close(True)

    asyncio.run(batch())
    return outputs
