"""The archiver: every session written back in dsh's own layout and framing.

``<root>/<project>/<session>/session.jsonl.zstd``: the header frame, then one
zstd frame per consumer batch holding the session's records exactly as they
were shipped (packed rows stay packed). An archived session opens in dsh and
in ``dsh-pipeline inspect`` as the logical log that was shipped, and an
archive root is itself shippable.

The file is the state: on first sight of a session (after a restart or a
rebalance) its archive file is looked up in the root's project folders and
its stored length says which seq comes next (a frame torn by a crash is cut
off; its records are read again from Kafka, whose offsets were not yet
committed). Duplicates are skipped by seq; a gap holds the session's later
records until the missing one arrives, kept durably in the root's
``.dsh-archiver-held.sqlite`` (written before the commit, so a restart
finds them; the shipper's discovery ignores it). Offsets are committed
after fsync. Sessions live in a bounded LRU; a revoked partition's sessions
are dropped at once, since another member continues their files.
"""

from __future__ import annotations

import os
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition

from prometheus_client import Counter

from dsh_kafka.config import ConsumerSettings, KafkaConfig
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord
from dsh_kafka.topics import TopicNames
from dsh_core.session_header import SessionHeader, parse_header_line
from dsh_core.jsonvalue import decode_json
from dsh_core.storage.layout import Compression, encode_segment, log_name, log_path
from dsh_core.storage.reader import load_session_bytes, read_events
from dsh_core.storage.writer import SessionFileWriter

from .runner import HELD_LIMIT, HOT_SESSIONS, ConsumerService, held_limit_error

__all__ = ["Archiver"]

ARCHIVED = Counter("dsh_archiver_events_total", "Session events written to archive files.")
FRAMES = Counter("dsh_archiver_frames_total", "Append batches (zstd frames) written.")
ARCHIVE_SKIPPED = Counter("dsh_archiver_records_skipped_total", "Records not archived, by reason.", ["reason"])

#: The archiver's held records, in the archive root.
HELD_FILE = ".dsh-archiver-held.sqlite"


@dataclass
class _Session:
    partition: int
    header: SessionHeader | None = None
    writer: SessionFileWriter | None = None
    lines: list[bytes] = field(default_factory=list)
    first_seq: int = 0
    next_seq: int = 0
    held: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # seq -> (value, count)
    held_dirty: bool = False


class Archiver(ConsumerService):
    service = "archiver"

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, root: Path, *, group: str = "dsh-archiver",
                 compression: Compression = "zstd", hot_sessions: int = HOT_SESSIONS,
                 settings: ConsumerSettings | None = None) -> None:
        super().__init__(kafka, topics, settings or ConsumerSettings(group_id=group))
        self.root = root
        self.compression = compression
        self.hot_sessions = hot_sessions
        self.held_db: sqlite3.Connection | None = None
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._dirty: dict[str, _Session] = {}  # with lines to write or held records to store

    async def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.held_db = sqlite3.connect(self.root / HELD_FILE, isolation_level=None, check_same_thread=False)
        self.held_db.execute("PRAGMA journal_mode=WAL")
        self.held_db.execute("CREATE TABLE IF NOT EXISTS held (session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
                             "value BLOB NOT NULL, count INTEGER NOT NULL, PRIMARY KEY (session_id, seq))")

    async def close(self) -> None:
        if self.held_db is not None:
            self.held_db.close()
            self.held_db = None

    # ------------------------------------------------------------- sessions

    def _session(self, session_id: str, partition: int) -> _Session:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
            return session
        path = self._existing(session_id)
        session = self._open(path, partition) if path is not None else _Session(partition)
        session.held = {seq: (value, count) for seq, value, count in self.held_db.execute(
            "SELECT seq, value, count FROM held WHERE session_id = ?", (session_id,))}
        self._sessions[session_id] = session
        return session

    def _existing(self, session_id: str) -> Path | None:
        """The session's archive file if a run before wrote one (its project
        folder comes from the header, which this run may never see)."""
        segment, name = encode_segment(session_id), log_name(self.compression)
        for project in self.root.iterdir():
            path = project / segment / name
            if path.is_file():
                return path
        return None

    def _open(self, path: Path, partition: int, header: SessionHeader | None = None) -> _Session:
        """A session writing to ``path``: continuing the file there (whose
        header it is) or, with ``header``, starting it."""
        next_seq = 0
        if path.exists():
            header, next_seq = _resume(path)
        assert header is not None
        session = _Session(partition, header=header, next_seq=next_seq, first_seq=next_seq)
        session.writer = SessionFileWriter(path, header, self.compression, next_seq=next_seq)
        return session

    # -------------------------------------------------------------- records

    async def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            ARCHIVE_SKIPPED.labels("attestation").inc()
            return
        session = self._session(decoded.session_id, record.partition)
        if decoded.kind == KIND_HEADER:
            if session.header is None:
                header = parse_header_line(decode_json(decoded.value), f"session {decoded.session_id!r} header")
                opened = self._open(log_path(self.root, header.cwd if isinstance(header.cwd, str) else None,
                                             header.id, self.compression), record.partition, header)
                opened.held, opened.held_dirty = session.held, session.held_dirty
                self._sessions[decoded.session_id] = session = opened
                self._drain(decoded.session_id, session)
            return
        if session.header is not None and decoded.seq < session.next_seq:
            ARCHIVE_SKIPPED.labels("duplicate").inc()
            return
        if session.header is None or decoded.seq > session.next_seq:
            if decoded.seq not in session.held:
                if len(session.held) >= HELD_LIMIT:
                    raise held_limit_error(decoded.session_id, session.next_seq, decoded.seq)
                session.held[decoded.seq] = (decoded.value, decoded.count)
                session.held_dirty = True
                self._dirty[decoded.session_id] = session
            return
        self._take(session, decoded.value, decoded.count)
        self._drain(decoded.session_id, session)

    def _take(self, session: _Session, value: bytes, count: int) -> None:
        if not session.lines:
            session.first_seq = session.next_seq
        session.lines.append(value)
        session.next_seq += count

    def _drain(self, session_id: str, session: _Session) -> None:
        while session.held and session.header is not None:
            for seq in [s for s in session.held if s < session.next_seq]:
                del session.held[seq]
                session.held_dirty = True
            item = session.held.pop(session.next_seq, None)
            if item is None:
                break
            session.held_dirty = True
            self._take(session, *item)
        if session.lines or session.held_dirty:
            self._dirty[session_id] = session

    # -------------------------------------------------------------- persist

    async def persist(self) -> None:
        held_changed = []
        for session_id, session in self._dirty.items():
            if session.lines:
                session.writer.append_lines(session.lines, session.first_seq, session.next_seq)
                ARCHIVED.inc(session.next_seq - session.first_seq)
                FRAMES.inc()
                session.lines = []
            if session.held_dirty:
                held_changed.append((session_id, session))
        self._dirty.clear()
        # After the files: a crash in between leaves held rows the file has
        # passed, which the next drain drops as below the next seq.
        if held_changed:
            db = self.held_db
            db.execute("BEGIN IMMEDIATE")
            try:
                for session_id, session in held_changed:
                    db.execute("DELETE FROM held WHERE session_id = ?", (session_id,))
                    db.executemany("INSERT INTO held (session_id, seq, value, count) VALUES (?, ?, ?, ?)",
                                   [(session_id, seq, value, count) for seq, (value, count) in session.held.items()])
                    session.held_dirty = False
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        while len(self._sessions) > self.hot_sessions:  # nothing unwritten is left to lose
            self._sessions.popitem(last=False)

    async def on_revoke(self, partitions: set[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        for session_id in [s for s, session in self._sessions.items() if session.partition in gone]:
            del self._sessions[session_id]


def _resume(path: Path) -> tuple[SessionHeader, int]:
    """The header and next seq of an archive file, cutting off a frame torn
    by a crash (a file left with its header only goes: it is started again)."""
    data = path.read_bytes()
    result = load_session_bytes(data, str(path), "zstd" if path.name.endswith(".zstd") else "none")
    if result.header is not None and result.committed_bytes < len(data) and result.error is None:
        with open(path, "r+b") as stream:
            stream.truncate(result.committed_bytes)
            os.fsync(stream.fileno())
    header, events = read_events(path)
    if not events:
        path.unlink()
    return header, len(events)
