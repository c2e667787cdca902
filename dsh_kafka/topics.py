"""The pipeline's topics (DESIGN.md "Topics and records"): names and specs."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BATCH_OVERHEAD_BYTES", "DEFAULT_PARTITIONS", "MAX_MESSAGE_BYTES", "TopicNames", "TopicSpec",
           "replication_for", "topic_specs"]

#: Large enough for big tool outputs (a 5 MiB result plus its envelope).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: What a batch of one record of :data:`MAX_MESSAGE_BYTES` adds around it.
BATCH_OVERHEAD_BYTES = 64 * 1024
#: Partitions of newly created topics (the most members a consumer group can use).
DEFAULT_PARTITIONS = 12


@dataclass(frozen=True)
class TopicNames:
    """Topic names; ``prefix`` keeps tests and tenants apart."""

    events: str = "dsh.session-events"
    views: str = "dsh.session-views"
    findings: str = "dsh.audit-findings"
    dead_letter: str = "dsh.dead-letter"

    @classmethod
    def with_prefix(cls, prefix: str) -> "TopicNames":
        base = cls()
        return cls(*(f"{prefix}{name}" for name in (base.events, base.views, base.findings, base.dead_letter)))


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    replication: int = 1


def replication_for(brokers: int) -> int:
    """Copies of each partition on a cluster of ``brokers``: three where
    there are three brokers or more, so ``acks=all`` survives a broker."""
    return max(1, min(3, brokers))


def topic_specs(names: TopicNames, partitions: int = DEFAULT_PARTITIONS, retention_ms: int = -1,
                replication: int = 1) -> list[TopicSpec]:
    """Events: delete policy, long retention; views: compacted; findings and
    dead letters: delete. All accept records up to :data:`MAX_MESSAGE_BYTES`.
    Each partition has ``replication`` copies, of which ``acks=all`` waits
    for all but one (``min.insync.replicas``).

    The events topic, written by every worker, is stored uncompressed: the
    broker then inflates each batch a producer sends (compressed on the
    wire) and refuses one over ``max.message.bytes`` after decompression, the
    only place Kafka bounds that. A topic that keeps the producer's
    compression passes a few-KB batch inflating to any size on to every
    consumer."""
    common = {"max.message.bytes": str(MAX_MESSAGE_BYTES), "min.insync.replicas": str(max(1, replication - 1))}
    events = {"cleanup.policy": "delete", "retention.ms": str(retention_ms), "compression.type": "uncompressed",
              "max.message.bytes": str(MAX_MESSAGE_BYTES + BATCH_OVERHEAD_BYTES)}
    return [
        TopicSpec(names.events, partitions, common | events, replication),
        TopicSpec(names.views, partitions, common | {"cleanup.policy": "compact"}, replication),
        TopicSpec(names.findings, partitions, common | {"cleanup.policy": "delete"}, replication),
        TopicSpec(names.dead_letter, partitions, common | {"cleanup.policy": "delete"}, replication),
    ]
