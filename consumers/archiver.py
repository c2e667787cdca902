"""The archiver: every session written back in dsh's own layout and framing.

``<root>/<project>/<session>/session.jsonl.zstd``: the header frame, then one
zstd frame per consumer batch holding the session's records exactly as they
were shipped (packed rows stay packed). An archived session opens in dsh and
in ``dsh-pipeline inspect`` as the logical log that was shipped, and an
archive root is itself shippable.

The file is the state: on first sight of a session after a restart its
stored length says which seq comes next (a frame torn by a crash is cut
off; its records are read again from Kafka, whose offsets were not yet
committed). Duplicates are skipped by seq; a gap holds the session's later
records until the missing one arrives. Offsets are committed after fsync.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter

from dsh_core.kafka.config import ConsumerSettings, KafkaConfig
from dsh_core.kafka.records import KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord
from dsh_core.kafka.topics import TopicNames
from dsh_core.session_header import SessionHeader, parse_header_line
from dsh_core.jsonvalue import decode_json
from dsh_core.storage.layout import Compression, log_path
from dsh_core.storage.reader import load_session_bytes, read_events
from dsh_core.storage.writer import SessionFileWriter

from .runner import HELD_LIMIT, ConsumerService, held_limit_error

__all__ = ["Archiver"]

ARCHIVED = Counter("dsh_archiver_events_total", "Session events written to archive files.")
FRAMES = Counter("dsh_archiver_frames_total", "Append batches (zstd frames) written.")
ARCHIVE_SKIPPED = Counter("dsh_archiver_records_skipped_total", "Records not archived, by reason.", ["reason"])



@dataclass
class _Session:
    header: SessionHeader | None = None
    writer: SessionFileWriter | None = None
    lines: list[bytes] = field(default_factory=list)
    first_seq: int = 0
    next_seq: int = 0
    held: dict[int, tuple[bytes, int]] = field(default_factory=dict)


class Archiver(ConsumerService):
    service = "archiver"

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, root: Path, *, group: str = "dsh-archiver",
                 compression: Compression = "zstd", settings: ConsumerSettings | None = None) -> None:
        super().__init__(kafka, topics, settings or ConsumerSettings(group_id=group))
        self.root = root
        self.compression = compression
        self._sessions: dict[str, _Session] = {}

    def _open(self, header: SessionHeader) -> _Session:
        path = log_path(self.root, header.cwd if isinstance(header.cwd, str) else None, header.id, self.compression)
        next_seq = 0
        if path.exists():
            next_seq = _resume(path)
        session = _Session(header=header, next_seq=next_seq, first_seq=next_seq)
        session.writer = SessionFileWriter(path, header, self.compression, next_seq=next_seq)
        return session

    async def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        session = self._sessions.get(decoded.session_id)
        if decoded.kind == KIND_HEADER:
            if session is None or session.header is None:
                header = parse_header_line(decode_json(decoded.value), f"session {decoded.session_id!r} header")
                opened = self._open(header)
                if session is not None:
                    opened.held = session.held
                session = self._sessions[decoded.session_id] = opened
                self._drain(session)
            return
        if decoded.kind != KIND_RECORD:
            ARCHIVE_SKIPPED.labels("attestation").inc()
            return
        if session is None:
            session = self._sessions[decoded.session_id] = _Session()
        if session.header is not None and decoded.seq < session.next_seq:
            ARCHIVE_SKIPPED.labels("duplicate").inc()
            return
        if session.header is None or decoded.seq > session.next_seq:
            if len(session.held) >= HELD_LIMIT:
                raise held_limit_error(decoded.session_id, session.next_seq, decoded.seq)
            session.held[decoded.seq] = (decoded.value, decoded.count)
            return
        self._take(session, decoded.value, decoded.count)
        self._drain(session)

    def _take(self, session: _Session, value: bytes, count: int) -> None:
        if not session.lines:
            session.first_seq = session.next_seq
        session.lines.append(value)
        session.next_seq += count

    def _drain(self, session: _Session) -> None:
        while session.held and session.header is not None:
            for seq in [s for s in session.held if s < session.next_seq]:
                del session.held[seq]
            item = session.held.pop(session.next_seq, None)
            if item is None:
                return
            self._take(session, *item)

    async def persist(self) -> None:
        for session in self._sessions.values():
            if session.lines and session.writer is not None:
                session.writer.append_lines(session.lines, session.first_seq, session.next_seq)
                ARCHIVED.inc(session.next_seq - session.first_seq)
                FRAMES.inc()
                session.lines = []


def _resume(path: Path) -> int:
    """The next seq of an archive file, cutting off a frame torn by a crash."""
    data = path.read_bytes()
    result = load_session_bytes(data, str(path), "zstd" if path.name.endswith(".zstd") else "none")
    if result.header is not None and result.committed_bytes < len(data) and result.error is None:
        with open(path, "r+b") as stream:
            stream.truncate(result.committed_bytes)
            os.fsync(stream.fileno())
    return len(read_events(path)[1])
