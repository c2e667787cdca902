"""The OpenTelemetry exporter: every session's turns, steps and tool calls
sent as OTLP spans, once each.

Records are ordered by the runtime's sequencing and fed to each session's
:class:`~.spans.SpanMapper`. At each checkpoint the spans the batch ended are
sent (:class:`OtelOutputs`, through the SDK's exporter, off the event loop);
only once the receiver accepted them are the sessions' states written to the
state file (next seq, open spans, held records, digests), and only then are
the offsets committed. A restart or a rebalance therefore reads again only
records whose spans were not accepted, and sends them with the same ids
(derived from the session and seq); records below a session's saved next
seq are duplicates and send nothing. A crash after the receiver accepted a
batch and before its state was written sends that batch's spans a second
time, with the same ids.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from aiokafka import AIOKafkaConsumer
from prometheus_client import Counter

from dsh_core.errors import DeletedSessionError, PipelineError
from dsh_core.formats import read_header
from dsh_kafka.config import KafkaConfig
from dsh_kafka.records import (KIND_DELETION, KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord, check_envelope,
                               where_of)
from dsh_kafka.topics import TopicNames
from dsh_core.session_header import SessionHeader

from ..runtime.config import ServiceConfig
from ..runtime.database import (DIGESTS_SCHEMA, HELD_SCHEMA, Database, applied_digest, load_held, store_digests,
                                store_held)
from ..runtime.outputs import ProducerOutputs
from ..runtime.policy import Policy
from ..runtime.sequencing import AppliedDigests, HeldRecords, Placement, deliver, drain
from ..runtime.service import ConsumerService
from ..runtime.writers import accept_header, check_session_writer
from .config import OtelExportConfig, OtlpSettings
from .spans import GenAISpan, SpanMapper

__all__ = ["OtelExport", "OtelOutputs", "otel_export_service"]

SPANS = Counter("dsh_otel_spans_total", "Spans the OTLP receiver accepted, by operation.", ["operation"])
SKIPPED = Counter("dsh_otel_records_skipped_total", "Records that send no span, by reason.", ["reason"])

_SESSIONS = ("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, "
             "header BLOB NOT NULL, mapper BLOB NOT NULL)")
_DELETED = "CREATE TABLE deleted_sessions (session_id TEXT PRIMARY KEY, at INTEGER NOT NULL)"


@dataclass
class ExportedSession:
    """One session's mapper and where its records stand."""

    partition: int
    held: HeldRecords
    digests: AppliedDigests
    mapper: SpanMapper
    header: SessionHeader | None = None
    header_line: bytes = b""
    seq: int = 0  # the next seq
    spans: list[GenAISpan] = field(default_factory=list)  # ended by this batch
    changed: bool = False
    deleted: bool = False

    def next_seq(self) -> int | None:
        return self.seq if self.header is not None else None

    def held_bytes(self) -> int:
        return self.held.bytes

    def apply(self, value: bytes, count: int) -> bool:
        self.spans += self.mapper.feed(value)
        self.seq += count
        self.changed = True
        return True


class OtelExport(Policy[ExportedSession, Database]):
    name = "otel-exporter"
    config: OtelExportConfig

    def __init__(self, config: OtelExportConfig) -> None:
        super().__init__(config)
        self._changed: dict[str, ExportedSession] = {}
        # persisted, their state not yet written (it is once their spans are
        # accepted): an evicted one comes back from here, not from the file
        self._unwritten: dict[str, ExportedSession] = {}
        self._deletions: dict[str, int] = {}
        self.log = logging.getLogger("dsh.otel-exporter")

    def open_store(self) -> Database:
        return Database(self.config.state, "otel-exporter", 1, [HELD_SCHEMA, DIGESTS_SCHEMA, _SESSIONS, _DELETED])

    def _opened(self) -> Database:
        """The state file (opened before the first batch)."""
        assert self.store is not None, "the exporter's state file is opened before the first batch"
        return self.store

    def _session(self, session_id: str, partition: int) -> ExportedSession:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        session = self._unwritten.get(session_id)
        if session is None:
            db = self._opened().connection
            session = ExportedSession(partition, HeldRecords(session_id, load_held(db, session_id)),
                                      AppliedDigests(session_id, functools.partial(applied_digest, db, session_id)),
                                      SpanMapper(session_id, self.config.content))
            if db.execute("SELECT 1 FROM deleted_sessions WHERE session_id = ?", (session_id,)).fetchone():
                session.deleted = True
            row = db.execute("SELECT next_seq, header, mapper FROM sessions WHERE session_id = ?",
                             (session_id,)).fetchone()
            if row is not None:
                session.seq, session.header_line = row[0], bytes(row[1])
                session.header = read_header(session.header_line, f"session {session_id!r} header")
                session.mapper = SpanMapper(session_id, self.config.content, bytes(row[2]))
        self.sessions.put(session_id, session)
        return session

    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind == KIND_DELETION:
            self._changed.pop(decoded.session_id, None)
            self._unwritten.pop(decoded.session_id, None)
            self.sessions.forget(decoded.session_id)
            self._deletions[decoded.session_id] = record.timestamp
            return
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            SKIPPED.labels("attestation").inc()
            return
        session_id = decoded.session_id
        session = self._session(session_id, record.partition)
        if session.deleted or session_id in self._deletions:
            raise DeletedSessionError(session_id, decoded.seq, where_of(record))
        if decoded.kind == KIND_HEADER:
            header = accept_header(decoded, session.header, session.digests)
            if header is not None:
                session.header, session.header_line, session.changed = header, decoded.value, True
                drain(session)
                self._changed[session_id] = session
            return
        check_session_writer(decoded, session.header, session.digests)
        check_envelope(decoded)
        if deliver(session, decoded.seq, decoded.value, decoded.count) is Placement.DUPLICATE:
            SKIPPED.labels("duplicate").inc()
        if session.changed or session.held.dirty:
            self._changed[session_id] = session

    def persist(self) -> None:
        """Hand the batch's spans and the sessions' new states to the
        outputs: the states are written once the spans were accepted."""
        spans: list[GenAISpan] = []
        rows, held, digests = [], [], []
        for session_id, session in self._changed.items():
            self._unwritten[session_id] = session
            spans += session.spans
            session.spans = []
            if session.changed:
                rows.append((session_id, session.seq, session.header_line, session.mapper.state()))
                session.changed = False
            if session.held.dirty:
                held.append((session_id, session.held.changes()))
            if session.digests.dirty:
                digests.append((session_id, session.digests.changes()))
        self._changed.clear()
        deletions, self._deletions = self._deletions, {}
        store, unwritten = self._opened(), self._unwritten

        def write_state() -> None:
            with store.transaction() as db:
                store_digests(db, digests)
                store_held(db, held)
                db.executemany("INSERT INTO sessions (session_id, next_seq, header, mapper) VALUES (?, ?, ?, ?) "
                               "ON CONFLICT (session_id) DO UPDATE SET next_seq = excluded.next_seq, "
                               "header = excluded.header, mapper = excluded.mapper", rows)
                for session_id, at in deletions.items():
                    for table in ("held", "applied", "sessions"):
                        db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
                    db.execute("INSERT INTO deleted_sessions (session_id, at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                               (session_id, at))
            unwritten.clear()  # the next batch persists only after this write: all of it was this batch's

        if spans or rows or held or digests or deletions:
            assert isinstance(self.outputs, OtelOutputs)
            self.outputs.export(spans, write_state)
        self.sessions.evict()

    async def close(self, drained: bool) -> None:
        try:
            await super().close(drained)
        finally:
            if isinstance(self.outputs, OtelOutputs):
                self.outputs.close_sender()


class OtelOutputs(ProducerOutputs):
    """Dead letters through the producer; spans through OTLP, then the
    state, before the offsets are committed."""

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, service: str, settings: OtlpSettings) -> None:
        super().__init__(kafka, topics, service)
        self.settings = settings
        self.sender: Any = None  # an OtlpSender, made in start()
        self._exports: list[tuple[list[GenAISpan], Callable[[], None]]] = []

    async def start(self, consumer: AIOKafkaConsumer) -> None:
        try:
            from .otlp import OtlpSender
        except ImportError as error:
            raise PipelineError(f"export-otel needs the OpenTelemetry SDK ({error.name} is missing): "
                                "pip install 'dsh-pipeline[otel]'") from None
        self.sender = OtlpSender(self.settings)
        logging.getLogger("dsh.otel-exporter").info("sending spans to %s", self.sender.where)
        await super().start(consumer)

    def export(self, spans: list[GenAISpan], then: Callable[[], None]) -> None:
        """Queue spans to send at the next flush, and what to do once the
        receiver accepted them (write the state that goes with them)."""
        self._exports.append((spans, then))

    async def flush(self) -> None:
        await super().flush()
        exports, self._exports = self._exports, []
        assert self.sender is not None
        for spans, then in exports:
            if spans:
                await asyncio.to_thread(self.sender.send, spans)
                for span in spans:
                    SPANS.labels(str(span.attributes["gen_ai.operation.name"])).inc()
            then()

    def close_sender(self) -> None:
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.close()


def otel_export_service(config: OtelExportConfig) -> ConsumerService:
    return ConsumerService(config, OtelExport(config),
                           OtelOutputs(config.kafka, config.topics, OtelExport.name, config.otlp))
