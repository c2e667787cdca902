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
Offsets are committed after fsync.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter

from dsh_core.folds import read_header
from dsh_core.session_header import SessionHeader
from dsh_core.storage.layout import Compression
from dsh_core.storage.writer import SessionFileWriter
from dsh_kafka.records import (KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord, check_envelope, check_format, check_identity,
                               check_same_header)

from ..runtime.config import ServiceConfig
from ..runtime.database import (DIGESTS_SCHEMA, HELD_SCHEMA, Database, applied_digest, load_held, store_digests,
                                store_held)
from ..runtime.outputs import ProducerOutputs
from ..runtime.policy import Policy
from ..runtime.sequencing import AppliedDigest, AppliedDigests, HeldRecords, Placement, deliver, drain
from ..runtime.service import ConsumerService
from .files import existing_file, new_file, resume

__all__ = ["Archive", "ArchiverConfig", "HELD_FILE", "archiver_service"]

ARCHIVED = Counter("dsh_archiver_events_total", "Session events written to archive files.")
FRAMES = Counter("dsh_archiver_frames_total", "Append batches (zstd frames) written.")
ARCHIVE_SKIPPED = Counter("dsh_archiver_records_skipped_total", "Records not archived, by reason.", ["reason"])

#: The archiver's held records, in the archive root.
HELD_FILE = ".dsh-archiver-held.sqlite"


@dataclass(frozen=True, kw_only=True)
class ArchiverConfig(ServiceConfig):
    root: Path  # the archive root
    compression: Compression = "zstd"
    group: str = "dsh-archiver"


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


class Archive(Policy[ArchivedSession]):
    name = "archiver"
    config: ArchiverConfig
    store: Database | None

    def __init__(self, config: ArchiverConfig) -> None:
        super().__init__(config)
        self._changed: dict[str, ArchivedSession] = {}  # with lines to write or held records to store

    def open_store(self) -> Database:
        """The held records (the archive files are the rest of its state)."""
        return Database(self.config.root / HELD_FILE, "archiver-held", 2, [HELD_SCHEMA, DIGESTS_SCHEMA])

    def _session(self, session_id: str, partition: int) -> ArchivedSession:
        session = self.sessions.get(session_id)
        if session is None:
            session = ArchivedSession(partition, HeldRecords(session_id, load_held(self.store.connection, session_id)),
                                      AppliedDigests(session_id, functools.partial(self._stored_digest, session_id)))
            path = existing_file(self.config.root, session_id, self.config.compression)
            if path is not None:
                session.start(*resume(path, self.config.compression))
            self.sessions.put(session_id, session)
        return session

    def _stored_digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        return applied_digest(self.store.connection, session_id, seq)

    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            ARCHIVE_SKIPPED.labels("attestation").inc()
            return
        session_id = decoded.session_id
        session = self._session(session_id, record.partition)
        if decoded.kind == KIND_HEADER:
            if session.header is not None:
                check_same_header(decoded, session.header)
            else:
                header = read_header(decoded.value, f"session {session_id!r} header")
                check_identity(decoded, header)
                path = new_file(self.config.root, header, self.config.compression)
                if path.exists():
                    session.start(*resume(path, self.config.compression))
                else:
                    session.start(header, 0, SessionFileWriter(path, header, self.config.compression))
                drain(session)
                self._changed[session_id] = session
            return
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
        if digests:
            with self.store.transaction() as db:
                for session_id, rows in digests:
                    store_digests(db, session_id, rows)
        held_changed = []
        for session_id, session in self._changed.items():
            if session.lines:
                session.writer.append_lines(session.lines, session.first_seq, session.seq)
                ARCHIVED.inc(session.seq - session.first_seq)
                FRAMES.inc()
                session.lines = []
            if session.held.dirty:
                held_changed.append(session.held)
        self._changed.clear()
        # After the files: a crash in between leaves held rows the file has
        # passed, which the next drain drops as below the next seq.
        if held_changed:
            with self.store.transaction() as db:
                for held in held_changed:
                    store_held(db, held)
        self.sessions.evict()  # nothing unwritten is left to lose


def archiver_service(config: ArchiverConfig) -> ConsumerService:
    return ConsumerService(config, Archive(config), ProducerOutputs(config.kafka, config.topics, Archive.name))
