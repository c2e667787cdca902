"""The pipeline's topics (DESIGN.md "Topics and records"): names and specs."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DEFAULT_PARTITIONS", "MAX_MESSAGE_BYTES", "TopicNames", "TopicSpec", "topic_specs"]

#: Large enough for big tool outputs (a 5 MiB result plus its envelope).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
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


def topic_specs(names: TopicNames, partitions: int = DEFAULT_PARTITIONS, retention_ms: int = -1) -> list[TopicSpec]:
    """Events: delete policy, long retention; views: compacted; findings and
    dead letters: delete. All accept records up to :data:`MAX_MESSAGE_BYTES`."""
    size = str(MAX_MESSAGE_BYTES)
    return [
        TopicSpec(names.events, partitions, {"cleanup.policy": "delete", "retention.ms": str(retention_ms),
                                             "max.message.bytes": size}),
        TopicSpec(names.views, partitions, {"cleanup.policy": "compact", "max.message.bytes": size}),
        TopicSpec(names.findings, partitions, {"cleanup.policy": "delete", "max.message.bytes": size}),
        TopicSpec(names.dead_letter, partitions, {"cleanup.policy": "delete", "max.message.bytes": size}),
    ]
