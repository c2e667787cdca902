"""What every consumer service is configured with (one frozen value each,
built once at the edge; a service adds its own fields by subclassing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dsh_kafka.config import ConsumerSettings, KafkaConfig, Secret
from dsh_kafka.topics import TopicNames

__all__ = ["HOT_SESSIONS", "ServiceConfig"]

#: Sessions a service keeps in memory by default (its LRU).
HOT_SESSIONS = 20_000


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    kafka: KafkaConfig
    topics: TopicNames = TopicNames()
    group: str
    max_records: int = 10_000  # per poll batch: one persist and commit each
    hot_sessions: int = HOT_SESSIONS
    start_from: Literal["earliest", "latest"] = "earliest"  # where a group without offsets begins
    session_timeout_ms: int = 10_000  # a member silent that long loses its partitions
    instance_id: str | None = None  # static membership: a restart within the timeout keeps the partitions
    redrive_key: Secret | None = None  # verifies redrive marks (consumers.runtime.redrive_mark)

    def consumer_settings(self) -> ConsumerSettings:
        return ConsumerSettings(group_id=self.group, max_records=self.max_records, auto_offset_reset=self.start_from,
                                session_timeout_ms=self.session_timeout_ms, group_instance_id=self.instance_id)
