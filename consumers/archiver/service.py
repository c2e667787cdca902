"""The archiver: every session written back in dsh's own layout and framing.

An archived session opens in dsh and in ``dsh-pipeline inspect`` as the
logical log that was shipped (packed rows stay packed), and an archive root
is itself shippable. On first sight of a session (after a restart or a
rebalance) its archive file is looked up in the root's project folders and
continued (:mod:`.files`); a frame torn by a crash is cut off and its
records are read again from Kafka, whose offsets were not yet committed.

Records are ordered by the runtime's sequencing; those held at a gap are
kept durably in the root's ``.dsh-archiver-held.sqlite`` (written before
the commit, so a restart finds them; the shipper's discovery ignores it),
and so is the digest of every record archived, written before the file so
a copy with other bytes (a second writer) is never taken for a duplicate.
A record of another writer than the archived header's is refused
(``conflicting-writer``, :mod:`..runtime.writers`): the file holds its
first writer's log.
Offsets are committed after fsync.

With ``v4_copies`` each v0 and v3 session also gets the v4 log dsh 0.2.1
migrates it to, beside its file (:func:`.files.write_v4_copy`), written
after the batch's files; a parent's copy is written again when one of its
subagent children changes (dsh catalogues the children). A restart writes
the copy of every session it resumes again, so a crash between a file and
its copy leaves no stale copy: the batch's offsets were not committed, and
its records come back.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter

from dsh_core.errors import DeletedSessionError, DshError
from dsh_core.formats import format_for, read_header
from dsh_core.session_header import SessionHeader
from dsh_core.storage.layout import Compression, generation_of
from dsh_core.storage.reader import header_line_of
from dsh_core.storage.writer import SessionFileWriter
from dsh_kafka.records import (KIND_DELETION, KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord, check_envelope,
                               check_format, where_of)

from ..runtime.config import ServiceConfig
from ..runtime.database import (DIGESTS_SCHEMA, HELD_SCHEMA, Database, applied_digest, load_held, store_digests,
                                store_held)
from ..runtime.outputs import ProducerOutputs
from ..runtime.policy import Policy
from ..runtime.sequencing import AppliedDigest, AppliedDigests, HeldRecords, Placement, deliver, drain
from ..runtime.service import ConsumerService
from ..runtime.writers import accept_header, check_session_writer
from .files import archived_files, existing_file, new_file, remove_session, resume, write_v4_copy

__all__ = ["Archive", "ArchiverConfig", "HELD_FILE", "archiver_service"]

ARCHIVED = Counter("dsh_archiver_events_total", "Session events written to archive files.")
FRAMES = Counter("dsh_archiver_frames_total", "Append batches (zstd frames) written.")
ARCHIVE_SKIPPED = Counter("dsh_archiver_records_skipped_total", "Records not archived, by reason.", ["reason"])
V4_COPIES = Counter("dsh_archiver_v4_copies_total",
                    "v4 copies of v0/v3 sessions written, or refused where dsh refuses to migrate the log.",
                    ["outcome"])

#: The archiver's held records, digests and deleted sessions, in the archive root.
HELD_FILE = ".dsh-archiver-held.sqlite"
_DELETED = "CREATE TABLE deleted_sessions (session_id TEXT PRIMARY KEY, at INTEGER NOT NULL)"


@dataclass(frozen=True, kw_only=True)
class ArchiverConfig(ServiceConfig):
    root: Path  # the archive root
    compression: Compression = "zstd"
    group: str = "dsh-archiver"
    v4_copies: bool = False  # also write each v0/v3 session as the v4 log dsh migrates it to


@dataclass
class ArchivedSession:
    """One session's archive file and the records of this batch for it."""

    partition: int
    held: HeldRecords
    digests: AppliedDigests
    header: SessionHeader | None = None
    writer: SessionFileWriter | None = None
    lines: list[bytes] = field(default_factory=list)
    first_seq: int = 0  # of ``lines``
    seq: int = 0  # the next seq
    copy_due: bool = False  # its v4 copy is to be written after this batch's files
    copy_refusal: str | None = None  # why dsh refuses to migrate it, as last reported
    deleted: bool = False  # delete-session fenced it: none of its records is archived again

    def next_seq(self) -> int | None:
        return self.seq if self.header is not None else None

    def held_bytes(self) -> int:
        return self.held.bytes

    def apply(self, value: bytes, count: int) -> bool:
        if not self.lines:
            self.first_seq = self.seq
        self.lines.append(value)
        self.seq += count
        return True

    def start(self, header: SessionHeader, seq: int, writer: SessionFileWriter) -> None:
        self.header, self.seq, self.first_seq, self.writer = header, seq, seq, writer

    def started(self) -> tuple[SessionHeader, SessionFileWriter]:
        """Its header and file, which :meth:`start` gave (before any line)."""
        assert self.header is not None and self.writer is not None, "a session is started before its lines"
        return self.header, self.writer


class Archive(Policy[ArchivedSession, Database]):
    name = "archiver"
    config: ArchiverConfig

    def __init__(self, config: ArchiverConfig) -> None:
        super().__init__(config)
        self._changed: dict[str, ArchivedSession] = {}  # with lines to write or held records to store
        self._children: dict[str, set[Path]] | None = None  # archive files of subagents, by parent (when needed)
        self._deletions: dict[str, int] = {}  # sessions deleted by this batch: when (ms)
        self.log = logging.getLogger("dsh.archiver")

    def open_store(self) -> Database:
        """The held records (the archive files are the rest of its state)."""
        return Database(self.config.root / HELD_FILE, "archiver-held", 3, [HELD_SCHEMA, DIGESTS_SCHEMA, _DELETED],
                        {2: lambda db: db.execute(_DELETED)})

    def _session(self, session_id: str, partition: int) -> ArchivedSession:
        session = self.sessions.get(session_id)
        if session is None:
            if self.store.connection.execute("SELECT 1 FROM deleted_sessions WHERE session_id = ?",
                                             (session_id,)).fetchone():
                session = self._tombstone(session_id, partition)
            else:
                session = ArchivedSession(partition, HeldRecords(session_id, load_held(self.store.connection,
                                                                                       session_id)),
                                          AppliedDigests(session_id, functools.partial(self._stored_digest, session_id)))
                path = existing_file(self.config.root, session_id, self.config.compression)
                if path is not None:
                    self._resume(session_id, session, path)
            self.sessions.put(session_id, session)
        return session

    def _tombstone(self, session_id: str, partition: int) -> ArchivedSession:
        return ArchivedSession(partition, HeldRecords(session_id), AppliedDigests(session_id), deleted=True)

    def _delete(self, session_id: str, partition: int, at: int) -> None:
        """The fence of a deleted session: its folder goes now, its held
        records and digests with the batch, and it stays deleted."""
        self._changed.pop(session_id, None)
        self.sessions.put(session_id, self._tombstone(session_id, partition))
        remove_session(self.config.root, session_id)
        self._deletions[session_id] = at

    def _resume(self, session_id: str, session: ArchivedSession, path: Path) -> None:
        header, seq, writer = resume(path, self.config.compression)
        session.start(header, seq, writer)
        if self._copied(header):  # a crash may have come between the file and its copy
            session.copy_due = True
            self._changed[session_id] = session

    def _copied(self, header: SessionHeader) -> bool:
        return self.config.v4_copies and not format_for(header.version).current

    def _stored_digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        return applied_digest(self.store.connection, session_id, seq)

    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind == KIND_DELETION:
            self._delete(decoded.session_id, record.partition, record.timestamp)
            return
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            ARCHIVE_SKIPPED.labels("attestation").inc()
            return
        session_id = decoded.session_id
        session = self._session(session_id, record.partition)
        if session.deleted:
            raise DeletedSessionError(session_id, decoded.seq, where_of(record))
        if decoded.kind == KIND_HEADER:
            header = accept_header(decoded, session.header, session.digests)
            if header is not None:
                path = new_file(self.config.root, header, self.config.compression)
                if path.exists():
                    self._resume(session_id, session, path)
                else:
                    session.start(header, 0, SessionFileWriter(path, header, self.config.compression))
                    if self._children is not None and header.origin == "subagent":
                        self._children.setdefault(str(header.parentSession), set()).add(path)
                drain(session)
                self._changed[session_id] = session
            return
        check_session_writer(decoded, session.header, session.digests)
        check_format(decoded, session.header)
        check_envelope(decoded)  # the file takes the value as it is: its seq and count must be what it says
        if deliver(session, decoded.seq, decoded.value, decoded.count) is Placement.DUPLICATE:
            ARCHIVE_SKIPPED.labels("duplicate").inc()
        elif session.lines or session.held.dirty:
            self._changed[session_id] = session

    def persist(self) -> None:
        # Digests before the files: a crash in between makes the records
        # come again from Kafka and be archived with the same digests.
        digests = [(session_id, session.digests.changes()) for session_id, session in self._changed.items()
                   if session.digests.dirty]
        if digests or self._deletions:
            with self.store.transaction() as db:
                store_digests(db, digests)
                for session_id, at in self._deletions.items():
                    for table in ("held", "applied"):
                        db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
                    db.execute("INSERT INTO deleted_sessions (session_id, at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                               (session_id, at))
            self._deletions = {}
        held_changed, copies = [], []
        for session_id, session in self._changed.items():
            if session.lines:
                if not self._appended(session_id, session):
                    continue
                ARCHIVED.inc(session.seq - session.first_seq)
                FRAMES.inc()
                session.lines = []
                session.copy_due = self._copied(session.started()[0])
            elif session.writer is not None:
                session.writer.create_empty()  # a session without events yet: its header alone, as dsh keeps it
            if session.copy_due:
                copies.append(session)
            if session.held.dirty:
                held_changed.append((session_id, session.held.changes()))
        self._changed.clear()
        # After the files: a crash in between leaves held rows the file has
        # passed, which the next drain drops as below the next seq.
        if held_changed:
            with self.store.transaction() as db:
                store_held(db, held_changed)
        if self.config.v4_copies:
            self._write_copies(copies)
        self.sessions.evict()  # nothing unwritten is left to lose

    def _appended(self, session_id: str, session: ArchivedSession) -> bool:
        """Append the batch's lines to the session's file; ``False`` when the
        file was removed under the archiver (``delete-session --archive``
        before its fence arrives): the session is let go, not the service,
        and its file is not made again from a later seq."""
        _, writer = session.started()
        try:
            writer.append_lines(session.lines, session.first_seq, session.seq)
        except FileNotFoundError:
            self.log.warning("session %r: %s was removed while it was archived (deleted?); seqs %d to %d are not "
                             "written to it", session_id, writer.path, session.first_seq, session.seq - 1)
            ARCHIVE_SKIPPED.labels("file-removed").inc(session.seq - session.first_seq)
            self.sessions.forget(session_id)
            return False
        return True

    def _write_copies(self, sessions: list[ArchivedSession]) -> None:
        """The v4 copies of these sessions (after their files), then of the
        parents of those that are subagents."""
        started = [(session, *session.started()) for session in sessions]
        parents = {str(header.parentSession) for _, header, _ in started
                   if header.origin == "subagent" and header.parentSession}  # "" names no session
        done = set()
        for session, header, writer in started:
            self._write_copy(header.id, writer.path, session)
            session.copy_due = False
            done.add(header.id)
        for parent_id in sorted(parents - done):
            path = existing_file(self.config.root, parent_id, self.config.compression)
            if path is not None and generation_of(path) != 4:
                self._write_copy(parent_id, path, self.sessions.get(parent_id))

    def _write_copy(self, session_id: str, path: Path, session: ArchivedSession | None) -> None:
        refusal = write_v4_copy(path, self._children_of(session_id))
        V4_COPIES.labels("refused" if refusal else "written").inc()
        reason = str(refusal) if refusal is not None else None
        if refusal is not None and (session is None or session.copy_refusal != reason):
            self.log.warning("session %r: no v4 copy beside %s: dsh refuses to migrate it (%s: %s); the archive "
                             "file holds every record", session_id, path, refusal.category, reason)
        if session is not None:
            session.copy_refusal = reason

    def _children_of(self, session_id: str) -> set[Path]:
        """The archive files of the subagent sessions of ``session_id``
        (the root is read once, then new ones are added as they come)."""
        if self._children is None:
            self._children = {}
            for path in archived_files(self.config.root, self.config.compression):
                try:
                    header = read_header(header_line_of(path), str(path))
                except (DshError, OSError):
                    continue
                if header.origin == "subagent":
                    self._children.setdefault(str(header.parentSession), set()).add(path)
        return self._children.get(session_id, set())


def archiver_service(config: ArchiverConfig) -> ConsumerService:
    outputs = ProducerOutputs(config.kafka, config.topics, Archive.name, config.redrive_key)
    return ConsumerService(config, Archive(config), outputs)
