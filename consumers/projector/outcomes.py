"""The findings, dead letters and audit verdict counts, materialized into
the view store where readers query them.

The auditor publishes its findings and each session's verdict counts (in
Kafka transactions) and every service its dead letters to their topics;
the topics stay the record of truth. :class:`OutcomeIndex`, run by the
projector command beside the projection, reads the three topics
committed-only and writes each finding and dead letter as one row keyed by
where it was read (topic, partition, offset) and each session's latest
counts as its row, in one store transaction per batch together with the
next offset of every partition it covers. On assignment it resumes from the offsets the store
holds, not from the group's: a crash between the store's commit and the
group's can neither lose nor repeat a row. The group's offsets are
committed too, for lag to show.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from prometheus_client import Counter

from dsh_core.errors import DecodeError
from dsh_core.jsonvalue import MAX_SAFE_INTEGER, decode_json, encode_json
from dsh_kafka.clients import make_consumer
from dsh_kafka.config import ConsumerSettings

from ..runtime.config import ServiceConfig
from .store import ViewStore

__all__ = ["OutcomeIndex", "finding_row", "letter_row", "verdict_row"]

INDEXED = Counter("dsh_projector_outcomes_indexed_total",
                  "Findings, dead letters and verdict counts written to the view store (kind unreadable: verdict "
                  "records that are no counts object, logged and passed over).", ["kind"])
_HEAD_BYTES = 256
#: The most characters a safe integer is written with (a sign and 16 digits).
_DIGITS = len(str(-MAX_SAFE_INTEGER))
_POLL_MS = 500


def finding_row(record: Any) -> tuple:
    """The ``findings`` row of a findings-topic record (a value that is no
    finding object is kept with rule ``unreadable`` and its text)."""
    try:
        finding = decode_json(record.value or b"")
    except DecodeError:  # any bytes: the row says what they were
        finding = None
    if not isinstance(finding, dict):
        text = (record.value or b"")[:_HEAD_BYTES].decode("utf-8", "backslashreplace")
        finding = {"rule": "unreadable", "severity": "error", "detail": f"not a finding object: {text}"}
    session = finding.get("session")
    if not isinstance(session, str):
        session = (record.key or b"").decode("utf-8", "backslashreplace")
    return (record.topic, record.partition, record.offset, session, str(finding.get("rule")),
            str(finding.get("severity", "error")), _integer(finding.get("seq")), _integer(finding.get("turn")),
            _integer(finding.get("step")), str(finding.get("detail", "")), record.timestamp)


def letter_row(record: Any) -> tuple:
    """The ``dead_letters`` row of a dead-letter-topic record (a key that is
    no UTF-8 is no session's: the row names none)."""
    headers = {name: value.decode("utf-8", "backslashreplace") for name, value in record.headers or ()
               if isinstance(value, bytes)}
    value = record.value or b""
    size = _integer(headers.get("dsh-dlq-value-size")) or len(value)
    return (record.topic, record.partition, record.offset, headers.get("dsh-dlq-service", "unknown"),
            headers.get("dsh-dlq-reason", "unknown"), headers.get("dsh-dlq-error", ""), headers.get("dsh-dlq-topic"),
            _integer(headers.get("dsh-dlq-partition")), _integer(headers.get("dsh-dlq-offset")),
            _session_of(record.key), _integer(headers.get("dsh-seq")),
            record.timestamp, size, value[:_HEAD_BYTES])


def verdict_row(record: Any) -> tuple | None:
    """The ``audit_verdicts`` row of a verdicts-topic record, ``None`` for a
    value that is no counts object (only the auditor writes the topic)."""
    try:
        counts = decode_json(record.value or b"")
    except DecodeError:
        counts = None
    if not (isinstance(counts, dict) and isinstance(counts.get("session"), str)
            and isinstance(counts.get("attested"), dict) and isinstance(counts.get("wire"), dict)):
        return None
    text = encode_json({"attested": counts["attested"], "wire": counts["wire"]}).decode()
    return (counts["session"], text, record.topic, record.partition, record.offset, record.timestamp)


def _session_of(key: bytes | None) -> str | None:
    """A dead letter's session: its key, when that is UTF-8."""
    try:
        return key.decode("utf-8") if key else None
    except UnicodeDecodeError:
        return None


def _integer(value: Any) -> int | None:
    """A safe integer (what the services write), else ``None``: a record's
    header or field is anything its producer put there (thousands of
    digits too, which ``int`` refuses to parse)."""
    if isinstance(value, str) and len(value) <= _DIGITS and value.isascii() and value.lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SAFE_INTEGER:
        return value
    return None


@dataclass(frozen=True, kw_only=True)
class OutcomeIndexConfig(ServiceConfig):
    store: Any  # the view store's location (a path or a postgresql:// URI)


class OutcomeIndex:
    """Reads the findings, dead-letter and verdicts topics into the view store."""

    def __init__(self, config: OutcomeIndexConfig) -> None:
        self.config = config
        self.log = logging.getLogger("dsh.projector.outcomes")
        self.store: ViewStore | None = None

    async def run(self, stop: asyncio.Event) -> None:
        config = self.config
        topics = (config.topics.findings, config.topics.dead_letter, config.topics.verdicts)
        self.store = store = ViewStore(config.store)
        consumer = make_consumer(config.kafka, ConsumerSettings(group_id=config.group, max_records=config.max_records,
                                                                session_timeout_ms=config.session_timeout_ms))
        consumer.subscribe(list(topics), listener=_ResumeFromStore(consumer, store))
        try:
            await consumer.start()
            self.log.info("indexing %s into the view store in group %s", ", ".join(topics), config.group)
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=_POLL_MS, max_records=config.max_records)
                if not batch:
                    continue
                findings, letters, offsets = [], [], {}
                verdicts: dict[str, tuple[Any, ...]] = {}
                for partition, records in batch.items():
                    if partition.topic == config.topics.findings:
                        findings += [finding_row(record) for record in records]
                    elif partition.topic == config.topics.verdicts:
                        for record in records:
                            self._verdict(record, verdicts)
                    else:
                        letters += [letter_row(record) for record in records]
                    offsets[partition] = records[-1].offset + 1
                store.index_outcomes(findings, letters, list(verdicts.values()),
                                     {(tp.topic, tp.partition): n for tp, n in offsets.items()})
                INDEXED.labels("finding").inc(len(findings))
                INDEXED.labels("dead-letter").inc(len(letters))
                INDEXED.labels("verdicts").inc(len(verdicts))
                try:  # for lag only: the store's offsets are where reading resumes
                    await consumer.commit(offsets)
                except (CommitFailedError, IllegalStateError) as error:  # a rebalance moved the partitions on
                    self.log.info("offsets not committed to the group (%s): the store has them", type(error).__name__)
        finally:
            await consumer.stop()
            store.close()


    def _verdict(self, record: Any, latest: dict[str, tuple]) -> None:
        """Keep the record's counts as its session's latest of the batch (a
        session's records are in order on one partition)."""
        row = verdict_row(record)
        if row is None:
            INDEXED.labels("unreadable").inc()
            self.log.warning("%s[%d]@%d: not a verdict-counts object; passed over", record.topic, record.partition,
                             record.offset)
        else:
            latest[row[0]] = row


class _ResumeFromStore(ConsumerRebalanceListener):
    def __init__(self, consumer: Any, store: ViewStore) -> None:
        self.consumer, self.store = consumer, store

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        pass  # every batch is in the store before the next poll: nothing is pending

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        stored = self.store.outcome_offsets()
        fresh = []
        for partition in assigned:
            offset = stored.get((partition.topic, partition.partition))
            if offset is None:
                fresh.append(partition)
            else:
                self.consumer.seek(partition, offset)
        if fresh:
            await self.consumer.seek_to_beginning(*fresh)
