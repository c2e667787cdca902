"""The projector: every session's derived, model-visible conversation.

Per session it runs the fold of the session's format (dsh_core.formats.registry: v0's
staged fold, v4's, v3 migrated to v4 as dsh does), ordered by the runtime's
sequencing: duplicates (the bytes applied before at their seq) are counted
and skipped, other bytes at an applied seq are a conflicting writer's and
dead-lettered, and so is every record of another writer than the session's
header's (:mod:`consumers.runtime.writers`): the session is then
``conflicted`` (its first writer's records are still applied). A record above the next seq holds the
session (status ``held``; its later records are kept) until the missing one
arrives and the session heals. A record the fold refuses marks the session refused and
is dead-lettered with its category.

One store transaction per batch writes every changed session (view, fold
snapshot, surface rows, held records, applied digests) before the offsets
are committed, so views are exactly-once. Each assignment claims its
partitions in the store (their owner epochs go up), and a batch is written
only while this member's epochs are current: a member the group replaced
while it stalled stops with :class:`FencedError` instead of writing over
its successor's views. A cold session, or one whose partition was revoked
and came back, is restored from its snapshot. View heads go to the
compacted ``dsh.session-views`` topic; the same transaction notes each
session whose head is not acknowledged yet, and the note goes once the
batch is committed. A member assigned a partition first publishes the
heads still noted for its sessions, so a crash between the view commit and
the heads' acknowledgement loses no head.

Each session's fold, analysis, status and rows: :class:`~consumers.projector.projected_session.ProjectedSession`.
A gateway's attestations of a session's requests are kept beside its steps
(:mod:`~consumers.projector.gateway_requests`), written with the batch.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from aiokafka import TopicPartition
from prometheus_client import Counter, Gauge

from dsh_core.errors import ConflictingWriterError, DeletedSessionError, DshError, InternalError, UnstorableError
from dsh_core.formats import open_fold, opened_header
from dsh_core.fold_snapshot import restore_fold
from dsh_kafka.records import (KIND_DELETION, KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord, check_format,
                               KIND_WIRE, check_identity, check_same_header, where_of)

from ..runtime.config import ServiceConfig
from ..runtime.outputs import ProducerOutputs
from ..runtime.policy import CommittedOffset, Policy
from ..runtime.sequencing import AppliedDigest, AppliedDigests, HeldRecords, Placement, check_copy, deliver, drain
from ..runtime.service import ConsumerService
from ..runtime.writers import check_session_writer, take_header
from .gateway_requests import RequestRow, request_row
from .projected_session import PriceFunction, ProjectedSession
from .store import SessionChange, ViewStore, view_head

__all__ = ["Projection", "ProjectorConfig", "projector_service"]

APPLIED = Counter("dsh_projector_events_applied_total", "Session events folded into views.")
DUPLICATES = Counter("dsh_projector_duplicates_total", "Records skipped as already applied (seq below expected).")
GAPS = Counter("dsh_projector_gaps_total", "Records that arrived above the expected seq (session held).")
SKIPPED = Counter("dsh_projector_records_skipped_total", "Records not applied, by reason.", ["reason"])
REPUBLISHED = Counter("dsh_projector_heads_republished_total",
                      "View heads published again on assignment (a crash left them unacknowledged).")
SESSIONS = Gauge("dsh_projector_sessions", "Sessions by state (hot in memory, held at a gap).", ["state"])

_log = logging.getLogger("dsh.projector")


@dataclass(frozen=True, kw_only=True)
class ProjectorConfig(ServiceConfig):
    store: Path | str  # the view store: a SQLite file, or a postgresql:// URI
    group: str = "dsh-projector"
    price: PriceFunction | None = None  # counts dsh_cost_usd_total (none: no cost counted)


class Projection(Policy[ProjectedSession, ViewStore]):
    name = "projector"
    config: ProjectorConfig

    def __init__(self, config: ProjectorConfig) -> None:
        super().__init__(config)
        self._changed: dict[str, ProjectedSession] = {}
        self._handled: dict[str, list[KafkaRecord]] = {}  # the batch's records each session took, until persisted
        self._unacknowledged: list[str] = []  # sessions whose heads the commit in flight covers
        self._unstored: set[str] = set()  # the batch's sessions the store has no row of (prepare)
        self._epochs: dict[int, int] = {}  # the owner epoch of each assigned partition (ViewStore.claim)
        self._deleted: set[str] = set()  # the batch's sessions that were deleted (prepare, and its deletions)
        self._deletions: dict[str, tuple[int, int]] = {}  # deleted by this batch: partition, when (ms)
        self._requests: list[tuple[str, int, RequestRow]] = []  # the batch's gateway requests

    def open_store(self) -> ViewStore:
        return ViewStore(self.config.store)

    def prepare(self, session_ids: set[str]) -> None:
        """Ask the store once which of the batch's cold sessions it has never
        stored: those start empty without a lookup each (catching up, most
        of a batch's sessions are new; on PostgreSQL each lookup is a round
        trip)."""
        cold = [session_id for session_id in session_ids if self.sessions.get(session_id) is None]
        self._unstored = set(cold) - self.store.stored(cold) if cold else set()
        self._deleted = self.store.deleted(list(session_ids))
        for session_id in self._deleted:  # deleted (delete-session) while this member held it
            self._forget(session_id)

    def _session(self, session_id: str, partition: int) -> ProjectedSession:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        unstored = session_id in self._unstored
        saved = None if unstored else self.store.load(session_id)
        self._unstored.discard(session_id)
        held = saved[3] if saved is not None else ()
        session = ProjectedSession(session_id, partition, HeldRecords(session_id, held),
                                   AppliedDigests(session_id, functools.partial(self._stored_digest, session_id),
                                                  unstored), price=self.config.price)
        if saved is not None:
            session.status, blob, session.error = saved[0], saved[1], saved[2]
            if session.status == "conflicted":  # the view's status: the session's own is held or open
                session.conflicted, session.status = True, "held" if held else "open"
            if blob is not None:
                rows = self.store.surface_events(session_id)
                session.fold = restore_fold(blob, f"session {session_id!r}", session.analysis, rows)
                session.stored_surface = {seq for seq, _, _ in rows}
                session.clock.resume(self.store.steps(session_id))
        self.sessions.put(session_id, session)
        return session

    def _stored_digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        return self.store.digest(session_id, seq)

    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind == KIND_DELETION:
            self._forget(decoded.session_id)
            self._deleted.add(decoded.session_id)
            self._deletions[decoded.session_id] = (record.partition, record.timestamp)
            return
        if decoded.session_id in self._deleted and decoded.kind in (KIND_HEADER, KIND_RECORD):
            raise DeletedSessionError(decoded.session_id, decoded.seq, where_of(record))
        if decoded.kind == KIND_WIRE and decoded.session_id not in self._deleted:
            row = request_row(decoded.seq, decoded.value)
            if row is not None:  # shown beside the steps (the auditor checks it)
                self._requests.append((decoded.session_id, record.partition, row))
                return
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            SKIPPED.labels("attestation").inc()
            return
        session = self._session(decoded.session_id, record.partition)
        try:
            check_session_writer(decoded, session.fold.header if session.fold is not None else None, session.digests)
            if session.status == "refused":
                if decoded.kind == KIND_RECORD:
                    self._copy_of_refused(session, decoded)
                SKIPPED.labels("session-refused").inc()
                return
            if decoded.kind == KIND_HEADER:
                self._header(session, decoded)
            else:
                self._record(session, decoded)
            self._handled.setdefault(session.session_id, []).append(record)
            if session.applied or decoded.kind == KIND_HEADER:
                session.ingested_at = max(session.ingested_at or 0, record.timestamp)
        except ConflictingWriterError:
            session.conflicted = True
            self._changed[session.session_id] = session
            raise
        finally:
            if session.applied:
                self.tally.add(APPLIED, session.applied)
                session.applied = 0

    def _forget(self, session_id: str) -> None:
        """Hold nothing of a deleted session (its store rows go with the batch)."""
        self.sessions.forget(session_id)
        self._changed.pop(session_id, None)

    def refuse(self, error: DshError, record: KafkaRecord) -> bool:
        session = self.sessions.get(record.key.decode("utf-8", "replace")) if record.key else None
        if isinstance(error, InternalError) and session is not None:  # its state is not trusted any more
            session.refuse(error)
            self._changed[session.session_id] = session
        return super().refuse(error, record)

    def _copy_of_refused(self, session: ProjectedSession, decoded: SessionRecord) -> None:
        """A refused session's record at an applied seq in other bytes is a
        second writer's: its refusal was that writer's doing, and says so."""
        try:
            check_copy(session, decoded.seq, decoded.value, decoded.count)
        except ConflictingWriterError as error:
            session.refuse(error)
            self._changed[session.session_id] = session
            raise

    def _header(self, session: ProjectedSession, decoded: SessionRecord) -> None:
        if session.fold is not None:
            check_same_header(decoded, opened_header(session.fold))
            self.tally.add(DUPLICATES)
            return
        self._changed[session.session_id] = session
        try:
            fold = open_fold(decoded.value, f"session {decoded.session_id!r}", session.analysis)
        except DshError as error:
            session.refuse(error)
            raise
        check_identity(decoded, opened_header(fold))
        take_header(decoded, opened_header(fold), session.digests)
        session.fold = fold
        session.timed(decoded.value, -1)
        drain(session)
        self._heal(session)

    def _record(self, session: ProjectedSession, decoded: SessionRecord) -> None:
        check_format(decoded, session.fold.header if session.fold is not None else None)
        try:
            placement = deliver(session, decoded.seq, decoded.value, decoded.count)
        except DshError:
            self._changed[session.session_id] = session  # a refusal changed its status
            raise
        if placement is Placement.DUPLICATE:
            self.tally.add(DUPLICATES)
            return
        self._changed[session.session_id] = session
        if placement is Placement.APPLIED:
            self._heal(session)
            return
        if placement is Placement.HELD:
            self.tally.add(GAPS)
        session.status = "held"

    @staticmethod
    def _heal(session: ProjectedSession) -> None:
        if session.status == "held" and not session.held:
            session.status = "open"

    def persist(self) -> None:
        handled, self._handled = self._handled, {}
        requests, self._requests = self._requests, []
        if not self._changed and not self._deletions and not requests:
            return
        changes = [session.change() for session in self._changed.values()]
        try:
            gone = self.store.write(changes, self._epochs, self._deletions, requests)
        except UnstorableError:  # one session's rows: each is written alone, and those refused refuse their session
            gone = self.store.write([], self._epochs, self._deletions, requests)
            written = (self._write_alone(change, handled.get(change.session_id, [])) for change in changes)
            changes = [change for change in written if change is not None]
        changes = [change for change in changes if change.session_id not in gone]
        self._changed.clear()
        for change in changes:
            self.outputs.send(change.partition, self.config.topics.views, change.session_id.encode(),
                              view_head(change.view))
        for session_id, (partition, _) in self._deletions.items():  # the compacted topic forgets it too
            self.outputs.send(partition, self.config.topics.views, session_id.encode(), None)
        self._deletions = {}
        self._unacknowledged = [change.session_id for change in changes]
        self.sessions.evict()  # nothing unwritten is left to lose
        SESSIONS.labels("hot").set(len(self.sessions))
        SESSIONS.labels("held").set(sum(1 for s in self.sessions if s.status == "held"))

    def _write_alone(self, change: SessionChange, records: list[KafkaRecord]) -> SessionChange | None:
        """Write one session's rows; rows the store refuses refuse the
        session, and the batch's ``records`` that made them are
        dead-lettered. What was written, or ``None`` for a session deleted
        meanwhile (nothing written)."""
        try:
            return None if self.store.write([change], self._epochs) else change
        except UnstorableError as error:
            _log.warning("dead-lettered %d record(s), reason %s; %s", len(records), error.category, error.message)
            for record in records:
                self.outputs.dead_letter(record, error)
            refused = self._changed[change.session_id].unstorable(error)
            return None if self.store.write([refused], self._epochs) else refused

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        self.store.acknowledged(self._unacknowledged)
        self._unacknowledged = []

    async def assigned(self, partitions: set[TopicPartition], committed: CommittedOffset) -> None:
        """Publish the heads a crash left unacknowledged for these partitions'
        sessions (their views are committed; their records come back only
        as duplicates)."""
        self._epochs.update(self.store.claim(tp.partition for tp in partitions))
        heads = self.store.unacknowledged(tp.partition for tp in partitions)
        if not heads:
            return
        for session_id, partition, head in heads:
            self.outputs.send(partition, self.config.topics.views, session_id.encode(), head)
        await self.outputs.publish()
        await self.outputs.flush()
        self.store.acknowledged([session_id for session_id, _, _ in heads])
        REPUBLISHED.inc(len(heads))

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        await super().revoked(partitions)
        for tp in partitions:
            self._epochs.pop(tp.partition, None)
        SESSIONS.labels("hot").set(len(self.sessions))


def projector_service(config: ProjectorConfig) -> ConsumerService:
    outputs = ProducerOutputs(config.kafka, config.topics, Projection.name, config.redrive_key)
    return ConsumerService(config, Projection(config), outputs)
