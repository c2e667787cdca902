"""The auditor: proves, as records arrive, that every model request was
rebuildable from the log, and checks what the log itself promises.

Per session it runs dsh_core's staged fold with the auditor's checks
(:mod:`.checks`). Findings, one record each on ``dsh.audit-findings``:

* ``request-mismatch`` — an attestation's digest differs from the request
  rebuilt from the log prefix below its ``boundarySeq``;
* ``attestation-late`` — an attestation arrived after events at or beyond
  its boundary (the prefix can no longer be rebuilt);
* ``no-request-header`` / ``empty-history`` — a request boundary with no
  request header in force, or with nothing to send;
* ``sequence-gap`` — a record above the next seq, or before the session
  header (the session is held until the missing record arrives);
* ``lossless`` — a record whose JSON would not survive a round trip;
* ``conflicting-writer`` — a second writer of the session: a record of
  another writer than the session's header (:mod:`consumers.runtime.writers`), a second
  header differing from the first, or other bytes at a seq applied or held
  before. Reported once per session; every such record is dead-lettered
  and none is audited (the first writer's records still are);
* ``unsupported-format`` / ``invalid-log`` / ``corrupt-storage`` — the
  session's log is refused;
* ``invariant:<rule>`` — a turn/step/tool relation of docs/formats/v0.md §7.1 is broken.

Each session's verdict counts so far (worker attestations by verdict;
gateway requests by kind and verdict) go to the compacted
``dsh.audit-verdicts`` topic, one record per batch in which they changed.
Findings, verdict counts, dead letters and offsets are committed exactly
once per partition (:mod:`.transactions`). Session state lives in a bounded LRU
backed by a state store (:mod:`.store`) that only ever holds committed
state: a session the LRU evicts is written once the commit covering it has
landed, and every ``checkpoint_seconds`` (and on revoke and clean
shutdown) each changed session is written with its partition's committed
offset. On assignment the auditor replays each partition from that stored
offset (0 without one) up to the committed offset, dropping what the
replay finds (it was reported before); a stored session already past a
replayed record skips it as a duplicate. So a restart neither repeats nor
loses a finding, and replays at most one checkpoint interval.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import TopicPartition
from prometheus_client import Counter, Gauge

from dsh_core.errors import ConflictingWriterError, DecodeError, DeletedSessionError, DshError, InternalError
from dsh_core.formats import opened_header
from dsh_kafka.records import (KIND_ATTESTATION, KIND_DELETION, KIND_HEADER, KIND_RECORD, KIND_WIRE, KafkaRecord,
                               SessionRecord, check_format, check_same_header, decode_kafka_record,
                               where_of)

from ..runtime.config import ServiceConfig
from ..runtime.policy import CommittedOffset, Policy
from ..runtime.sequencing import AppliedDigest, check_copy, deliver, drain
from ..runtime.service import ConsumerService
from ..runtime.writers import check_session_writer
from .findings import Finding, lossless_problem
from .replay import replay
from .session import AuditedSession, SavedSession
from .store import AuditStore
from .transactions import TransactionalOutputs

__all__ = ["Audit", "AuditorConfig", "auditor_service"]

FINDINGS = Counter("dsh_audit_findings_total", "Audit findings, by rule.", ["rule"])
REQUESTS = Counter("dsh_audit_requests_total", "Attested requests checked, by verdict.", ["verdict"])
WIRE_REQUESTS = Counter("dsh_audit_wire_requests_total", "Requests a gateway attested, by wire, kind and verdict "
                        "(verified, mismatch, unlogged, unattested; titles and compactions: classified).",
                        ["wire", "kind", "verdict"])
PENDING = Gauge("dsh_audit_attestations_pending", "Attestations waiting for the events below their boundary.")
AUDITED = Counter("dsh_audit_events_total", "Session events audited.")
AUDIT_SESSIONS = Gauge("dsh_audit_sessions", "Sessions held in memory by the auditor.")
REPLAYED = Counter("dsh_audit_replayed_records_total", "Records replayed (findings dropped) to rebuild state on assignment.")


@dataclass(frozen=True, kw_only=True)
class AuditorConfig(ServiceConfig):
    state: Path | None = None  # the state store (SQLite); None keeps it in memory
    checkpoint_seconds: float = 30.0  # how often every changed session is stored
    group: str = "dsh-auditor"
    require_gateway: bool = False  # a request boundary no gateway attested is a finding
    wire_deadline_seconds: float = 60.0  # how long a request and its boundary may wait for each other


class Audit(Policy[AuditedSession, AuditStore]):
    name = "auditor"
    config: AuditorConfig

    def __init__(self, config: AuditorConfig) -> None:
        super().__init__(config)
        self.replayed = 0  # records replayed on assignment
        self._changed: dict[str, AuditedSession] = {}  # since their last store write
        self._staged: dict[str, SavedSession] = {}  # stored once the commit in flight lands
        self._staged_checkpoint = False  # ... together with every partition's offset
        self._next_checkpoint = time.monotonic() + config.checkpoint_seconds
        self._pending_gauge_due = 0.0
        self._committed: dict[TopicPartition, int] = {}
        self._clocks: dict[int, int] = {}  # partition -> the latest record timestamp seen (ms)
        self._settled_at: dict[int, int] = {}  # partition -> its clock when last settled
        self._wire_waiting: dict[int, set[str]] = {}  # partition -> sessions with requests waiting to be matched
        self._counted: dict[str, AuditedSession] = {}  # sessions whose verdict counts this batch changed

    def open_store(self) -> AuditStore:
        return AuditStore(self.config.state, self.config.group, self.config.topics.events)

    async def close(self, drained: bool) -> None:
        try:
            if drained and self.is_open:  # after a failure, memory may hold a half-applied record
                self._store_now(set(self._committed))
        finally:
            await super().close(drained)

    # -------------------------------------------------------------- records

    def _load(self, session_id: str, partition: int) -> AuditedSession:
        """A session from memory, the commit in flight, the store, or new;
        marked changed."""
        session = self.sessions.get(session_id)
        if session is None:
            saved = self._staged.get(session_id) or self.store.load(session_id)
            stored = functools.partial(self._stored_digest, session_id)
            require = self.config.require_gateway
            session = (AuditedSession.restore(session_id, saved, stored, require) if saved is not None
                       else AuditedSession.new(session_id, partition, stored, require))
            self.sessions.put(session_id, session)
        self._changed[session_id] = session
        return session

    def _stored_digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        staged = self._staged.get(session_id)  # stored once the commit in flight lands
        digest = staged.digests.get(seq) if staged is not None else None
        return digest if digest is not None else self.store.digest(session_id, seq)

    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        session = self._load(decoded.session_id, record.partition)
        try:
            self._audit(session, record, decoded)
        finally:
            self._report(session)
        for settled in self._settle_wire(record.partition):
            self._report(settled)

    def _audit(self, session: AuditedSession, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind == KIND_DELETION:
            self._delete(session)
            return
        if session.deleted:
            raise DeletedSessionError(session.session_id, decoded.seq, where_of(record))
        try:
            self._audit_taken(session, record, decoded)
        except ConflictingWriterError as error:
            if not session.conflicted:  # one finding per session; each record is dead-lettered (refuse())
                session.conflicted = True
                session.report.finding("conflicting-writer", error.seq, f"{error.message} at {where_of(record)}")
            raise

    def _audit_taken(self, session: AuditedSession, record: KafkaRecord, decoded: SessionRecord) -> None:
        """A record of a session that takes records (not deleted)."""
        if decoded.kind in (KIND_HEADER, KIND_RECORD):
            check_session_writer(decoded, session.fold.header if session.fold is not None else None, session.digests)
        if session.refused:
            if decoded.kind == KIND_RECORD:  # a second writer still shows, and is named (refuse())
                check_copy(session, decoded.seq, decoded.value, decoded.count)
            return
        session.clock = record.timestamp
        if record.timestamp > self._clocks.get(record.partition, 0):
            self._clocks[record.partition] = record.timestamp
        try:
            self._audit_record(session, record, decoded)
        finally:
            if session.wire.waiting:
                self._wire_waiting.setdefault(record.partition, set()).add(session.session_id)

    def _audit_record(self, session: AuditedSession, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind == KIND_WIRE:
            session.wire_attestation(decoded.seq, decoded.value, record.timestamp)
            return
        if decoded.kind == KIND_HEADER:
            if session.fold is not None:
                check_same_header(decoded, opened_header(session.fold))
            elif session.start(decoded):
                drain(session)
                self._gap_closed(session)
            return
        if decoded.kind == KIND_ATTESTATION:
            session.attestation(decoded.seq, decoded.value)
            return
        problem = lossless_problem(decoded.value)
        if problem:
            session.report.finding("lossless", decoded.seq, problem)
        expected = session.next_seq()
        if expected is None or decoded.seq > expected:
            self._gap(session, expected, decoded.seq, record)
        check_format(decoded, session.fold.header if session.fold is not None else None)
        deliver(session, decoded.seq, decoded.value, decoded.count)  # a duplicate is transport, not a log defect
        self._gap_closed(session)

    def _delete(self, session: AuditedSession) -> None:
        """The fence of a deleted session: all it held is dropped; what is
        stored of it becomes this (a deleted session, nothing else) with the
        state store's next write."""
        session_id = session.session_id
        deleted = AuditedSession.new(session_id, session.partition, lambda seq: None, self.config.require_gateway)
        deleted.deleted = True
        self.sessions.put(session_id, deleted)
        self._changed[session_id] = deleted
        self._counted.pop(session_id, None)
        self._wire_waiting.get(session.partition, set()).discard(session_id)

    @staticmethod
    def _gap(session: AuditedSession, expected: int | None, seq: int, record: KafkaRecord) -> None:
        missing_from = expected or 0
        if session.gap_reported == missing_from:
            return
        session.gap_reported = missing_from
        missing = (f"records from seq {expected} to {seq - 1} are" if expected is not None
                   else "the session header is")
        session.report.finding("sequence-gap", missing_from, f"{missing} missing (got seq {seq} at "
                               f"{record.topic}[{record.partition}]@{record.offset})")

    @staticmethod
    def _gap_closed(session: AuditedSession) -> None:
        if not session.held:
            session.gap_reported = None

    def _settle_wire(self, partition: int) -> list[AuditedSession]:
        """Settle the requests waiting past the deadline on a partition whose
        clock moved a second or more since it was last settled: a function
        of the records alone, so a replay settles exactly as the first pass."""
        clock = self._clocks.get(partition, 0)
        if clock - self._settled_at.get(partition, 0) < 1000 or not self._wire_waiting.get(partition):
            return []
        self._settled_at[partition] = clock
        settled = []
        for session_id in sorted(self._wire_waiting[partition]):
            session = self._load(session_id, partition)
            session.wire.settle_due(clock, round(self.config.wire_deadline_seconds * 1000))
            settled.append(session)
        self._wire_waiting[partition] = {s.session_id for s in settled if s.wire.waiting}
        return settled

    def _report(self, session: AuditedSession) -> None:
        report = session.report
        if report.findings:
            for finding in report.findings:
                self._send(session.partition, finding)
            report.findings.clear()
        if report.verdicts:
            for verdict in report.verdicts:
                REQUESTS.labels(verdict).inc()
            report.verdicts.clear()
        if report.wire_verdicts:
            for labels in report.wire_verdicts:
                WIRE_REQUESTS.labels(*labels).inc()
            report.wire_verdicts.clear()
        if report.totals_changed:
            self._counted[session.session_id] = session
        if report.events:
            self.tally.add(AUDITED, report.events)
            report.events = 0

    def _send(self, partition: int, finding: Finding) -> None:
        self.outputs.send(partition, self.config.topics.findings, finding.session.encode(), finding.to_json())
        FINDINGS.labels(finding.rule).inc()

    def refuse(self, error: DshError, record: KafkaRecord) -> bool:
        session_id = record.key.decode("utf-8", "replace") if record.key else None
        session = self.sessions.get(session_id) if session_id is not None else None
        if isinstance(error, InternalError) and session is not None:  # its state is not trusted any more
            session.refuse(error, None)
            self._report(session)
        elif isinstance(error, DecodeError) and session_id is not None:
            self._send(record.partition, Finding("corrupt-storage", session_id, None,
                                                 f"{error.message} at {where_of(record)}"))
        return super().refuse(error, record)

    # ---------------------------------------------------------- state store

    def persist(self) -> None:
        # Each changed session's counts so far, once, in the transaction of the batch's offsets.
        for session_id, session in self._counted.items():
            self.outputs.send(session.partition, self.config.topics.verdicts, session_id.encode(),
                              session.report.counts_json())
            session.report.totals_changed = False
        self._counted.clear()
        # Memory now holds exactly the state the coming commit covers.
        if time.monotonic() >= self._next_checkpoint:
            self._next_checkpoint = time.monotonic() + self.config.checkpoint_seconds
            self._staged.update((session_id, session.snapshot()) for session_id, session in self._changed.items())
            self._changed.clear()
            self._staged_checkpoint = True
        self._staged.update(self._evict())

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        self._committed.update(offsets)
        staged, self._staged = self._staged, {}
        partitions = set(self._committed) if self._staged_checkpoint else set()
        self._staged_checkpoint = False
        self.store.write(staged, {tp.partition: self._committed[tp] for tp in partitions})
        if time.monotonic() >= self._pending_gauge_due:  # a sum over every session in memory: once a second
            self._pending_gauge_due = time.monotonic() + 1.0
            PENDING.set(sum(len(s.pending) for s in self.sessions))

    def _evict(self) -> dict[str, SavedSession]:
        """The snapshots of the evicted sessions changed since stored."""
        evicted = {session_id: session.snapshot() for session_id, session in self.sessions.evict()
                   if self._changed.pop(session_id, None) is not None}
        AUDIT_SESSIONS.set(len(self.sessions))
        return evicted

    def _store_now(self, partitions: set[TopicPartition]) -> None:
        """Store the changed sessions of these partitions, whose state in
        memory is their committed state (the runtime checkpointed), with
        their committed offsets."""
        committed = {tp: self._committed[tp] for tp in partitions if tp in self._committed}
        numbers = {tp.partition for tp in committed}
        sessions = {session_id: session.snapshot() for session_id, session in self._changed.items()
                    if session.partition in numbers}
        for session_id in sessions:
            del self._changed[session_id]
        self.store.write(sessions, {tp.partition: offset for tp, offset in committed.items()})

    # ----------------------------------------------------------- rebalances

    async def assigned(self, partitions: set[TopicPartition], committed: CommittedOffset) -> None:
        """Rebuild the assigned partitions' state: replay each from its
        stored offset (0 without one) to the committed offset."""
        ranges = {}
        for partition in sorted(partitions):
            offset = await committed(partition)
            if offset is None:
                continue
            self._committed[partition] = offset
            stored = self.store.stored_offset(partition.partition)
            if stored is not None and stored > offset:  # the group's offsets were moved back
                self.store.forget(partition.partition)
                stored = None
            if (stored or 0) < offset:
                ranges[partition] = (stored or 0, offset)
        await replay(self.config.kafka, ranges, self._replay_one,
                     lambda: self.store.write(self._evict(), {}))  # replayed state is committed state

    def _replay_one(self, record: KafkaRecord) -> None:
        self.replayed += 1
        REPLAYED.inc()
        try:
            decoded = decode_kafka_record(record)
        except DshError:
            return  # dead-lettered when it was first consumed
        session = self._load(decoded.session_id, record.partition)
        try:
            self._audit(session, record, decoded)
        except DshError:
            pass  # dead-lettered when it was first consumed
        session.report.clear()  # reported when it was first consumed
        for settled in self._settle_wire(record.partition):
            settled.report.clear()

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        self._store_now(partitions)
        for session_id, _ in self.sessions.drop_partitions({tp.partition for tp in partitions}):
            self._changed.pop(session_id, None)
        for partition in partitions:
            self._committed.pop(partition, None)
            for by_partition in (self._clocks, self._settled_at, self._wire_waiting):
                by_partition.pop(partition.partition, None)
        AUDIT_SESSIONS.set(len(self.sessions))


def auditor_service(config: AuditorConfig) -> ConsumerService:
    outputs = TransactionalOutputs(config.kafka, config.topics, Audit.name, config.group, config.redrive_key)
    return ConsumerService(config, Audit(config), outputs)
