"""The projector's view store: one SQLite file (WAL), one writer, readers
any time. Every statement on it is here.

``sessions`` holds each session's view (JSON), fold snapshot and status;
``surface`` its current surface events (changed by difference, never
rewritten); ``held`` the records it holds at a gap; ``applied`` the
digest of every record applied (a copy is checked against it); ``unacknowledged_heads``
the sessions whose view head is committed here but not yet acknowledged
by the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dsh_core.analysis import LogAnalysis
from dsh_core.folds import SessionFold
from dsh_core.fold_snapshot import restore_fold
from dsh_core.jsonvalue import decode_json, dump_json

from ..runtime.database import (DIGESTS_SCHEMA, HELD_SCHEMA, Database, applied_digest, load_held, store_digests,
                                store_held)
from ..runtime.sequencing import AppliedDigest, HeldRecords

__all__ = ["SavedSession", "SessionChange", "ViewStore", "view_head"]

_KIND, _LAYOUT = "view-store", 2
_SCHEMA = (
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, next_seq INTEGER NOT NULL, "
    "view TEXT NOT NULL, snapshot BLOB, error TEXT)",
    "CREATE TABLE surface (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL, "
    "PRIMARY KEY (session_id, seq))",
    HELD_SCHEMA,
    DIGESTS_SCHEMA,
    "CREATE TABLE unacknowledged_heads (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL)",
)
_HEAD_FIELDS = ("nextSeq", "surfaceLength", "replaceGeneration", "turns", "lastTurnEnd", "status", "messagesDigest")

#: ``(status, fold snapshot, error, held rows)`` of a stored session.
SavedSession = tuple[str, bytes | None, str | None, list[tuple[int, bytes, int]]]


def view_head(view: dict[str, Any]) -> bytes:
    """The ``dsh.session-views`` value of a view."""
    head = {field: view.get(field) for field in _HEAD_FIELDS}
    head["seq"] = head.pop("nextSeq")
    head["turns"] = len(head["turns"] or ())
    return dump_json(head)


class ViewStore:
    """The views of every session the projector has seen."""

    def __init__(self, path: Path) -> None:
        self.database = Database(path, _KIND, _LAYOUT, _SCHEMA)
        self.db = self.database.connection

    # --------------------------------------------------------------- reads

    def view(self, session_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT view FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else decode_json(row[0])

    def fold(self, session_id: str, analysis: LogAnalysis | None = None) -> SessionFold | None:
        """A session's fold restored from its snapshot and surface rows."""
        row = self.db.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None or row[0] is None:
            return None
        return restore_fold(row[0], f"session {session_id!r}", analysis, self.surface_events(session_id))

    def surface_events(self, session_id: str) -> list[tuple[int, str, Any]]:
        """The stored current surface events of a session."""
        return [(seq, kind, decode_json(data)) for seq, kind, data in self.db.execute(
            "SELECT seq, type, data FROM surface WHERE session_id = ? ORDER BY seq", (session_id,))]

    def load(self, session_id: str) -> SavedSession | None:
        row = self.db.execute("SELECT status, snapshot, error FROM sessions WHERE session_id = ?",
                              (session_id,)).fetchone()
        return None if row is None else (row[0], row[1], row[2], load_held(self.db, session_id))

    def digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        """The digest of the record applied at ``seq`` of a session."""
        return applied_digest(self.db, session_id, seq)

    def unacknowledged(self, partitions: Iterable[int]) -> list[tuple[str, int, bytes]]:
        """``(session id, partition, head)`` of the sessions of these
        partitions whose head was never acknowledged."""
        numbers = sorted(partitions)
        rows = self.db.execute(
            "SELECT u.session_id, u.partition, s.view FROM unacknowledged_heads u JOIN sessions s USING (session_id) "
            f"WHERE u.partition IN ({', '.join('?' * len(numbers))})", numbers).fetchall()
        return [(session_id, partition, view_head(decode_json(view))) for session_id, partition, view in rows]

    # -------------------------------------------------------------- writes

    def write(self, changes: Iterable["SessionChange"]) -> None:
        """Store changed sessions in one transaction, each noted as having an
        unacknowledged head."""
        with self.database.transaction() as db:
            for change in changes:
                change.write(db)

    def acknowledged(self, session_ids: list[str]) -> None:
        if session_ids:
            with self.database.transaction() as db:
                db.executemany("DELETE FROM unacknowledged_heads WHERE session_id = ?", [(s,) for s in session_ids])

    def close(self) -> None:
        self.database.close()


@dataclass(frozen=True, slots=True)
class SessionChange:
    """One session's rows as a batch left them (``held``: its held records,
    whose changes are written; ``None``: unchanged; ``digests``: of the
    records applied since the last change)."""

    session_id: str
    partition: int
    view: dict[str, Any]
    snapshot: bytes | None
    error: str | None
    surface_gone: Iterable[int]
    surface_new: Iterable[tuple[int, str, Any]]
    held: HeldRecords | None
    digests: dict[int, AppliedDigest]

    def write(self, db: Any) -> None:
        session_id = self.session_id
        db.executemany("DELETE FROM surface WHERE session_id = ? AND seq = ?",
                       [(session_id, seq) for seq in self.surface_gone])
        db.executemany("INSERT INTO surface (session_id, seq, type, data) VALUES (?, ?, ?, ?)",
                       [(session_id, seq, kind, dump_json(data).decode()) for seq, kind, data in self.surface_new])
        db.execute("INSERT INTO sessions (session_id, status, next_seq, view, snapshot, error) "
                   "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET status=excluded.status, "
                   "next_seq=excluded.next_seq, view=excluded.view, snapshot=excluded.snapshot, "
                   "error=excluded.error",
                   (session_id, self.view["status"], self.view["nextSeq"], dump_json(self.view).decode(),
                    self.snapshot, self.error))
        if self.held is not None:
            store_held(db, self.held)
        store_digests(db, session_id, self.digests)
        db.execute("INSERT OR REPLACE INTO unacknowledged_heads (session_id, partition) VALUES (?, ?)",
                   (session_id, self.partition))
