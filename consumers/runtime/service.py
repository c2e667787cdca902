"""The events topic's consumer: a policy's records, errors and checkpoints.

A :class:`ConsumerService` is a :class:`~.member.GroupMember` (the one poll
loop, rebalance protection, state and health every consumer shares) running
a :class:`~.policy.Policy` (what to do with a record) with its
:class:`~.outputs.Outputs` (where records go, how offsets are committed).
It guarantees:

* records of a partition are handled in offset order, in poll batches;
* a record that cannot be decoded, that the policy refuses, or that makes
  the policy fail unexpectedly (an :class:`InternalError` naming the
  exception) goes to :meth:`Policy.refuse` (by default the dead-letter
  topic, with the reason and ``topic[partition]@offset``) and is counted;
  nothing is skipped silently and one record never stops the service; only
  failures of the store, the disk or the cluster do;
* offsets are committed only after :meth:`Policy.persist` returned and every
  record it queued was acknowledged, never on a failure; auto-commit is off;
  a commit the group refuses because it moved the partitions on (this
  member's session expired) is logged, not fatal: the new owner reads those
  records again and skips what was applied;
* that acknowledgement wait and the commit run while the next batch is
  fetched and handled; the next checkpoint waits for them, so commits stay
  in order and a failure still stops the service;
* on revoke the service checkpoints before the partitions go; on assign the
  policy may ask for the group's committed offsets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
from typing import Any

from aiokafka import TopicPartition

from dsh_core.errors import DecodeError, DshError, InternalError, PipelineError
from dsh_kafka.records import decode_kafka_record, where_of

from .config import ServiceConfig
from .member import GroupMember, partition_fields, partition_names
from .metrics import COMMITS, RECORDS
from .outputs import Outputs
from .policy import Policy

__all__ = ["ConsumerService"]

#: Failures of what a service stands on, never of one record: they stop it.
_INFRASTRUCTURE = (PipelineError, OSError, sqlite3.OperationalError, MemoryError)


class ConsumerService(GroupMember):
    """A consumer group member running one policy over the events topic."""

    def __init__(self, config: ServiceConfig, policy: Policy, outputs: Outputs) -> None:
        super().__init__(config, policy.name)
        self.policy = policy
        self.outputs = outputs
        self._uncommitted: dict[TopicPartition, int] = {}  # next offset to commit
        self._committing: asyncio.Task[None] | None = None  # the last checkpoint's flush and commit
        self._counters: dict[str, Any] = {}

    def topics(self) -> list[str]:
        return [self.config.topics.events]

    async def opening(self) -> None:
        assert self.consumer is not None
        await self.outputs.start(self.consumer)
        await self.policy.open(self.outputs)

    async def after_poll(self) -> None:
        if self._committing is not None and self._committing.done():
            await self._commit_done()  # a failed commit stops the service even with no new batch

    async def abandon(self) -> None:
        if self._committing is not None:  # a clean drain awaited it
            self._committing.cancel()
            with contextlib.suppress(BaseException):
                await self._committing

    async def closing(self, drained: bool) -> None:
        try:
            await self.policy.close(drained)
        finally:
            await self.outputs.stop()

    def handle_batch(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """Hand one fetched batch to the policy, record by record in offset
        order; every record ends applied, held, a duplicate or refused."""
        policy = self.policy
        refused: collections.Counter[tuple[str, bool]] = collections.Counter()
        first: dict[str, tuple[Any, str]] = {}  # reason -> its first record and what was wrong with it
        policy.prepare({record.key.decode("utf-8", "replace") for records in batch.values() for record in records
                        if record.key})
        try:
            for partition, records in batch.items():
                for record in records:
                    try:
                        decoded = decode_kafka_record(record)
                        policy.tally.add(self._counter(decoded.kind))
                        policy.handle(record, decoded)
                    except _INFRASTRUCTURE:
                        raise  # the store, the disk or the cluster: the service stops, nothing is committed
                    except DshError as error:
                        if isinstance(error, DecodeError):
                            policy.tally.add(self._counter("undecodable"))
                        self._refuse(error, record, refused, first)
                    except Exception as error:  # a bug this record found: it is dead-lettered, the rest goes on
                        self._refuse(InternalError(f"{where_of(record)}: {type(error).__name__}: {error}"), record,
                                     refused, first)
                    self._uncommitted[partition] = record.offset + 1
                    self.handled(partition, record.offset + 1)
        finally:
            policy.tally.flush()
            for (reason, lettered), count in refused.items():  # one line per reason and batch, however many records
                record, message = first[reason]
                self.log.warning("dead-lettered %d record(s), reason %s; the first: %s: %s" if lettered else
                                 "refused %d redriven record(s) again, reason %s, their dead letters stand; the "
                                 "first: %s: %s", count, reason, where_of(record), message,
                                 extra={"count": count, "reason": reason, "topic": record.topic,
                                        "partition": record.partition, "offset": record.offset,
                                        "session": record.key.decode("utf-8", "replace") if record.key else None})

    def _refuse(self, error: DshError, record: Any, refused: collections.Counter[tuple[str, bool]],
                first: dict[str, tuple[Any, str]]) -> None:
        lettered = self.policy.refuse(error, record)
        if not lettered:
            self.policy.tally.add(self._counter("refused-again"))
        refused[error.category, lettered] += 1
        first.setdefault(error.category, (record, error.message[:500]))

    def _counter(self, kind: str) -> Any:
        counter = self._counters.get(kind)
        if counter is None:
            counter = self._counters[kind] = RECORDS.labels(self.name, kind)
        return counter

    # ---------------------------------------------------------- checkpoints

    async def checkpoint(self, wait: bool = True) -> None:
        """Persist, publish, then commit what the batch covers once every
        record is acknowledged (in the background unless ``wait``)."""
        await self._commit_done()
        if not self._uncommitted:
            return
        self.policy.persist()
        await self.outputs.publish()
        offsets, self._uncommitted = self._uncommitted, {}
        self._committing = asyncio.create_task(self._flush_and_commit(offsets))
        if wait:
            await self._commit_done()

    async def _flush_and_commit(self, offsets: dict[TopicPartition, int]) -> None:
        await self.outputs.flush()
        if not await self.outputs.commit(offsets):
            # The group gave these partitions to another member while this one
            # was busy (its session expired): their new owner reads the
            # uncommitted records again, and what was applied is a duplicate
            # there. This member rejoins; it does not stop.
            self.log.warning("offsets of %s not committed, the group moved on", partition_names(set(offsets)),
                             extra={"reason": "group-moved-on", **partition_fields(set(offsets))})
            return
        COMMITS.labels(self.name).inc()
        self.policy.committed(offsets)

    async def _commit_done(self) -> None:
        """Wait for the last checkpoint's commit; its failure is raised here."""
        committing, self._committing = self._committing, None
        if committing is not None:
            await committing

    # ----------------------------------------------------------- rebalances

    async def revoking(self, partitions: set[TopicPartition]) -> None:
        await self.checkpoint()
        await self.policy.revoked(partitions)
        await self.outputs.revoked(partitions)

    async def assigning(self, partitions: set[TopicPartition]) -> None:
        assert self.consumer is not None
        await self.outputs.assigned(partitions)  # fences previous owners before their offsets are read
        await self.policy.assigned(partitions, self.consumer.committed)

