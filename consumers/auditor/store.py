"""The auditor's state store: committed session state of one consumer
group on one topic, in one SQLite file (WAL).

``partitions`` says up to which offset every session of a partition is
stored; a session row may be further along (written when evicted), never
beyond the partition's committed offset. A file of another group or topic
is refused: its offsets mean nothing here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import Counter

from consumers.runtime.errors import StateStoreError
from dsh_core.fold_snapshot import is_pickled, restore_fold, snapshot_fold

from ..runtime.database import (DIGESTS_SCHEMA, HELD_SCHEMA, Database, applied_digest, load_held, replace_held,
                                store_digests)
from ..runtime.sequencing import AppliedDigest
from .session import SavedSession

__all__ = ["AuditStore"]

STORE_WRITES = Counter("dsh_audit_state_writes_total", "Session states written to the auditor's state store.")

_KIND, _LAYOUT = "auditor-state", 5
_SCHEMA = (
    "CREATE TABLE owner (singleton INTEGER PRIMARY KEY CHECK (singleton = 0), group_id TEXT NOT NULL, "
    "topic TEXT NOT NULL)",
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL, fold BLOB, state BLOB NOT NULL)",
    HELD_SCHEMA,
    DIGESTS_SCHEMA,
    "CREATE TABLE attestations (session_id TEXT NOT NULL, seq INTEGER NOT NULL, value BLOB NOT NULL, "
    "PRIMARY KEY (session_id, seq))",
    "CREATE TABLE partitions (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL)",
)


def _layout_4_to_5(db: Any) -> None:
    """Layout 4 held v3/v4 fold snapshots pickled (naming the modules of
    their classes): each is restored once and saved again as fold snapshot
    layout 3, which names none (the observer is the auditor's own, not saved)."""
    for (session_id,) in db.execute("SELECT session_id FROM sessions WHERE fold IS NOT NULL").fetchall():
        blob = bytes(db.execute("SELECT fold FROM sessions WHERE session_id = ?", (session_id,)).fetchone()[0])
        if is_pickled(blob):
            fold = restore_fold(blob, f"session {session_id!r}", None)
            db.execute("UPDATE sessions SET fold = ? WHERE session_id = ?", (snapshot_fold(fold), session_id))


class AuditStore:
    """``path`` ``None`` keeps the state in memory."""

    def __init__(self, path: Path | None, group: str, topic: str) -> None:
        self.database = Database(path, _KIND, _LAYOUT, _SCHEMA, {4: _layout_4_to_5})
        self.db = self.database.connection
        try:
            self._claim(group, topic)
        except BaseException:
            self.database.close()
            raise

    def _claim(self, group: str, topic: str) -> None:
        with self.database.transaction() as db:
            owner = db.execute("SELECT group_id, topic FROM owner").fetchone()
            if owner is None:
                db.execute("INSERT INTO owner VALUES (0, ?, ?)", (group, topic))
                return
        if tuple(owner) != (group, topic):
            raise StateStoreError(f"{self.database.where}: auditor state of group {owner[0]!r} on {owner[1]!r}, not "
                                  f"of group {group!r} on {topic!r}; give each group and topic its own --state")

    def load(self, session_id: str) -> SavedSession | None:
        row = self.db.execute("SELECT partition, fold, state FROM sessions WHERE session_id = ?",
                              (session_id,)).fetchone()
        if row is None:
            return None
        pending = dict(self.db.execute("SELECT seq, value FROM attestations WHERE session_id = ?", (session_id,)))
        return SavedSession(row[0], row[1], row[2], load_held(self.db, session_id), pending, {})

    def digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        """The digest of the record a session applied at ``seq``."""
        return applied_digest(self.db, session_id, seq)

    def stored_offset(self, partition: int) -> int | None:
        row = self.db.execute("SELECT next_offset FROM partitions WHERE partition = ?", (partition,)).fetchone()
        return None if row is None else row[0]

    def write(self, sessions: dict[str, SavedSession], offsets: dict[int, int]) -> None:
        """Store session states and, for partitions whose every changed
        session is among them, the offset they are all stored up to."""
        if not sessions and not offsets:
            return
        with self.database.transaction() as db:
            for session_id, saved in sessions.items():
                db.execute("INSERT OR REPLACE INTO sessions (session_id, partition, fold, state) VALUES (?, ?, ?, ?)",
                           (session_id, saved.partition, saved.fold, saved.state))
                replace_held(db, session_id, saved.held)
                db.execute("DELETE FROM attestations WHERE session_id = ?", (session_id,))
                if saved.deleted:  # the digests of its records go too
                    db.execute("DELETE FROM applied WHERE session_id = ?", (session_id,))
                db.executemany("INSERT INTO attestations (session_id, seq, value) VALUES (?, ?, ?)",
                               [(session_id, seq, value) for seq, value in saved.pending.items()])
            store_digests(db, ((session_id, saved.digests) for session_id, saved in sessions.items()))
            db.executemany("INSERT OR REPLACE INTO partitions (partition, next_offset) VALUES (?, ?)",
                           list(offsets.items()))
        STORE_WRITES.inc(len(sessions))

    def forget(self, partition: int) -> None:
        """Drop a partition's stored state (it is ahead of the committed offset)."""
        with self.database.transaction() as db:
            for table in ("held", "applied", "attestations"):
                db.execute(f"DELETE FROM {table} WHERE session_id IN "
                           "(SELECT session_id FROM sessions WHERE partition = ?)", (partition,))
            db.execute("DELETE FROM sessions WHERE partition = ?", (partition,))
            db.execute("DELETE FROM partitions WHERE partition = ?", (partition,))

    def close(self) -> None:
        self.database.close()
