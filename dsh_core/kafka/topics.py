"""The pipeline's topics (DESIGN.md "Topics and records") and their set-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import PipelineError

__all__ = ["TopicNames", "TopicSpec", "topic_specs", "ensure_topics", "MAX_MESSAGE_BYTES"]

#: Large enough for big tool outputs (a 5 MiB result plus its envelope).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


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


def topic_specs(names: TopicNames, partitions: int = 12, retention_ms: int = -1) -> list[TopicSpec]:
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


async def ensure_topics(admin: Any, specs: list[TopicSpec]) -> None:
    """Create missing topics and verify existing ones (idempotent).

    ``admin`` is a started ``AIOKafkaAdminClient``. An existing topic with a
    different partition count, cleanup policy or a smaller message limit is
    an error naming the topic and the setting.
    """
    from aiokafka.admin import NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    existing = set(await admin.list_topics())
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        response = await admin.create_topics(
            [NewTopic(spec.name, spec.partitions, 1, topic_configs=spec.configs) for spec in missing])
        for topic, code, *rest in response.topic_errors:
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (a concurrent creator)
                raise PipelineError(f"creating topic {topic} failed: error {code} {rest[-1] if rest else ''}")
    present = [spec for spec in specs if spec.name in existing]
    if not present:
        return
    described = {item["topic"]: item for item in await admin.describe_topics([s.name for s in present])}
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, s.name) for s in present])
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.resources:
            configs[resource[3]] = {entry[0]: entry[1] for entry in resource[4]}
    for spec in present:
        partitions = len(described[spec.name]["partitions"])
        if partitions != spec.partitions:
            raise PipelineError(f"topic {spec.name} exists with {partitions} partitions, expected {spec.partitions}: "
                                "keys would map to other partitions; use another topic prefix or recreate it")
        actual = configs.get(spec.name, {})
        policy = spec.configs.get("cleanup.policy")
        if policy and actual.get("cleanup.policy") != policy:
            raise PipelineError(f"topic {spec.name} has cleanup.policy={actual.get('cleanup.policy')}, expected {policy}")
        wanted = int(spec.configs.get("max.message.bytes", "0"))
        if wanted and int(actual.get("max.message.bytes", "0")) < wanted:
            raise PipelineError(f"topic {spec.name} has max.message.bytes={actual.get('max.message.bytes')}, "
                                f"below the {wanted} the pipeline needs")
