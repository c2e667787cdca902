"""The pipeline's topics (docs/reference/topics.md): names and specs."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from dsh_core.errors import PipelineError

__all__ = ["BATCH_OVERHEAD_BYTES", "DEFAULT_PARTITIONS", "MAX_MESSAGE_BYTES", "PREFIX_SEPARATORS", "RETAINED",
           "TopicLayout", "TopicNames", "TopicSpec", "topic_specs"]

#: Large enough for big tool outputs (a 5 MiB result plus its envelope).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: What a batch of one record of :data:`MAX_MESSAGE_BYTES` adds around it.
BATCH_OVERHEAD_BYTES = 64 * 1024
#: Partitions of newly created topics (the most members a consumer group can use).
DEFAULT_PARTITIONS = 12
#: What may end a topic prefix (the characters of a topic name besides letters and digits).
PREFIX_SEPARATORS = (".", "-", "_")


@dataclass(frozen=True)
class TopicNames:
    """Topic names; ``prefix`` keeps tests and tenants apart."""

    events: str = "dsh.session-events"
    views: str = "dsh.session-views"
    findings: str = "dsh.audit-findings"
    dead_letter: str = "dsh.dead-letter"
    verdicts: str = "dsh.audit-verdicts"  # each session's request verdict counts, compacted

    @classmethod
    def with_prefix(cls, prefix: str) -> "TopicNames":
        """The names with ``prefix`` before each. A prefix ends in a
        separator (:data:`PREFIX_SEPARATORS`) or is refused: ``eco3`` would
        run into the names (``eco3dsh.session-events``), and adding one
        would move a deployment already on such names to new, empty topics."""
        if prefix and not prefix.endswith(PREFIX_SEPARATORS):
            raise PipelineError(f"--topic-prefix {prefix!r} does not end in {', '.join(map(repr, PREFIX_SEPARATORS))}, "
                                f"so the topic names would run into it ({prefix}{cls().events}): give {prefix + '.'!r} "
                                f"for {prefix}.{cls().events}")
        base = cls()
        return cls(*(f"{prefix}{name}" for name in (base.events, base.views, base.findings, base.dead_letter,
                                                    base.verdicts)))


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    replication: int = 1


#: The topics whose retention a deployment sets (the views and verdicts topics are compacted: they keep every
#: session's last view and verdict counts).
RETAINED = ("events", "findings", "dead-letter")


@dataclass(frozen=True)
class TopicLayout:
    """How the pipeline's topics are made where they are missing: copies of
    each (``None``: the cluster's ``default.replication.factor``, never the
    brokers up at the time) and how many must acknowledge (``None``: all
    copies but one); retention by topic
    (:data:`RETAINED`, milliseconds, -1 forever; default forever)."""

    replication: int | None = None
    min_insync_replicas: int | None = None
    retention_ms: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def topic_specs(names: TopicNames, partitions: int = DEFAULT_PARTITIONS, replication: int = 1,
                layout: TopicLayout = TopicLayout()) -> list[TopicSpec]:
    """Events: delete policy, long retention; views and verdict counts:
    compacted; findings and dead letters: delete. All accept records up to :data:`MAX_MESSAGE_BYTES`.
    Each partition has ``replication`` copies, of which ``acks=all`` waits
    for all but one (``min.insync.replicas``).

    The events topic, written by every worker, is stored uncompressed: the
    broker then inflates each batch a producer sends (compressed on the
    wire) and refuses one over ``max.message.bytes`` after decompression, the
    only place Kafka bounds that. A topic that keeps the producer's
    compression passes a few-KB batch inflating to any size on to every
    consumer. ``layout`` sets acknowledgements and retention."""
    insync = layout.min_insync_replicas or max(1, replication - 1)
    common = {"max.message.bytes": str(MAX_MESSAGE_BYTES), "min.insync.replicas": str(insync)}

    def deleted(kind: str) -> dict[str, str]:
        return {"cleanup.policy": "delete", "retention.ms": str(layout.retention_ms.get(kind, -1))}

    events = deleted("events") | {"compression.type": "uncompressed",
                                  "max.message.bytes": str(MAX_MESSAGE_BYTES + BATCH_OVERHEAD_BYTES)}
    return [
        TopicSpec(names.events, partitions, common | events, replication),
        TopicSpec(names.views, partitions, common | {"cleanup.policy": "compact"}, replication),
        TopicSpec(names.findings, partitions, common | deleted("findings"), replication),
        TopicSpec(names.dead_letter, partitions, common | deleted("dead-letter"), replication),
        TopicSpec(names.verdicts, partitions, common | {"cleanup.policy": "compact"}, replication),
    ]
