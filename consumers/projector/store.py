"""The projector's view store, on SQLite (one file, WAL: the embedded
default) or PostgreSQL (projectors on many hosts in one group). Every
statement that writes it is here; the schema is documented in
docs/reference/view-store.md (layout 8).

``sessions`` holds each session's view (JSON), fold snapshot and status,
and the columns sessions are listed and filtered by (cwd, creation, last
activity, turn and message counts, tokens); creation and last activity are
the log's own event times (:mod:`dsh_core.event_time`), and
``ingested_at`` when the last record applied was written to the topic;
``usage`` its token totals by provider and model; ``steps`` each step's
event times and tokens (:mod:`.timings`); ``surface`` its current surface
events with their event times (changed by difference, never rewritten);
``held`` the records it holds at a gap;
``applied`` the digest of every record applied (a copy is checked
against it); ``unacknowledged_heads`` the sessions whose view head is
committed here but not yet acknowledged by the cluster. ``findings`` and
``dead_letters`` are the auditor's findings and every service's dead
letters, keyed by where they were read (topic, partition, offset).
``audit_verdicts`` holds each session's audit verdict counts (the
auditor's latest). ``partition_owners`` fences members: each assignment of a partition
raises its epoch, and a batch is written only by the member holding the
current epoch of every partition it touches.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import psycopg

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DeletedSessionError, FencedError, UnstorableError
from dsh_core.folds import SessionFold
from dsh_core.fold_snapshot import is_pickled, restore_fold, snapshot_fold
from dsh_core.jsonvalue import decode_json, dump_json

from ..runtime.database import (DIGESTS_SCHEMA, HELD_SCHEMA, Database, applied_digest, load_held, store_digests,
                                store_held)
from ..runtime.postgres import PostgresDatabase, first_line
from ..runtime.sequencing import AppliedDigest, HeldChanges
from ..runtime.store_location import store_backend
from .timings import STEP_COLUMNS, StepRow

__all__ = ["LAYOUT", "SavedSession", "SessionChange", "TOKEN_COLUMNS", "ViewStore", "message_texts", "view_head"]

_KIND, LAYOUT = "view-store", 8
#: The sessions deleted (delete-session): their rows are gone and none is written again.
_DELETED = "CREATE TABLE deleted_sessions (session_id TEXT PRIMARY KEY, at INTEGER NOT NULL)"
#: A record's dead letters, one per service (and consumer group) that refused it: readers show one per reason.
_LETTERS_BY_SOURCE = ("CREATE INDEX dead_letters_by_source ON dead_letters (source_topic, source_partition, "
                      "source_offset, reason)")
#: What a driver raises for a row refused for its content, not for the store.
_ROWS_REFUSED = (OverflowError, sqlite3.IntegrityError, sqlite3.DataError, psycopg.DataError, psycopg.IntegrityError)
_SESSION_COLUMNS = ("cwd TEXT", "created_at INTEGER", "last_activity INTEGER", "turn_count INTEGER NOT NULL DEFAULT 0",
                    "message_count INTEGER NOT NULL DEFAULT 0")
TOKEN_COLUMNS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
_LISTING = (
    "CREATE TABLE usage (session_id TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, "
    + ", ".join(f"{_column} INTEGER NOT NULL DEFAULT 0" for _column in TOKEN_COLUMNS)
    + ", PRIMARY KEY (session_id, provider, model))",
    # the listing's order (most recently active first) and its keyset cursor
    "CREATE INDEX sessions_by_activity ON sessions (COALESCE(last_activity, 0), session_id)",
    "CREATE INDEX sessions_by_status ON sessions (status, COALESCE(last_activity, 0), session_id)",
    "CREATE TABLE findings (topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, "
    "session_id TEXT NOT NULL, rule TEXT NOT NULL, severity TEXT NOT NULL, seq INTEGER, turn INTEGER, step INTEGER, "
    "detail TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))",
    "CREATE INDEX findings_by_session ON findings (session_id, seq)",
    "CREATE TABLE dead_letters (topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, "
    "service TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT NOT NULL, source_topic TEXT, source_partition INTEGER, "
    "source_offset INTEGER, session_id TEXT, seq INTEGER, at INTEGER NOT NULL, size INTEGER NOT NULL, "
    "head BLOB NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))",
    "CREATE INDEX dead_letters_by_session ON dead_letters (session_id)",
    "CREATE TABLE outcome_offsets (topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL, "
    "PRIMARY KEY (topic, partition))",
    # the records dead-letters --redrive sent back, by where they were first read
    "CREATE TABLE redriven (topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, "
    "at INTEGER NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))",
)
#: Each session's verdict counts as the auditor last published them (where they were read).
_VERDICTS = ("CREATE TABLE audit_verdicts (session_id TEXT PRIMARY KEY, counts TEXT NOT NULL, topic TEXT NOT NULL, "
             "partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, at INTEGER NOT NULL)")
#: Each events partition's owner epoch: raised by every assignment (:meth:`ViewStore.claim`).
_OWNERS = "CREATE TABLE partition_owners (partition INTEGER PRIMARY KEY, epoch INTEGER NOT NULL)"
#: A surface row's searchable text: its message's texts, lower-cased (:func:`message_texts`).
_SURFACE_TEXT = "text TEXT NOT NULL DEFAULT ''"
#: The tables holding rows of a session (what deleting a session removes).
_SESSION_TABLES = ("sessions", "usage", "surface", "held", "applied", "unacknowledged_heads", "findings", "dead_letters",
                   "audit_verdicts", "steps")
#: Layout 8: event times, ingestion time, steps and tokens (:func:`_layout_7_to_8`).
_EVENT_TIMES = (
    "ALTER TABLE surface ADD COLUMN event_time INTEGER",
    "ALTER TABLE sessions ADD COLUMN ingested_at INTEGER",
    "ALTER TABLE sessions ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX sessions_by_tokens ON sessions (tokens, session_id)",
    "CREATE INDEX sessions_by_creation ON sessions (COALESCE(created_at, 0), session_id)",
    "CREATE TABLE steps (session_id TEXT NOT NULL, turn INTEGER NOT NULL, step INTEGER NOT NULL, "
    "started_at INTEGER, output_at INTEGER, ended_at INTEGER, provider TEXT, model TEXT, "
    + ", ".join(f"{column} INTEGER NOT NULL DEFAULT 0" for column in STEP_COLUMNS[7:])
    + ", PRIMARY KEY (session_id, turn, step))",
)
_SCHEMA = (
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, next_seq INTEGER NOT NULL, "
    "view TEXT NOT NULL, snapshot BLOB, error TEXT, " + ", ".join(_SESSION_COLUMNS) + ")",
    "CREATE TABLE surface (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL, "
    f"{_SURFACE_TEXT}, PRIMARY KEY (session_id, seq))",
    *_EVENT_TIMES,
    HELD_SCHEMA,
    DIGESTS_SCHEMA,
    "CREATE TABLE unacknowledged_heads (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL)",
    *_LISTING,
    _OWNERS,
    _VERDICTS,
    _LETTERS_BY_SOURCE,
    _DELETED,
)


def message_texts(message: Any) -> list[str]:
    """What a text search finds in a derived message (or a surface event's
    data holding one): its text and reasoning, tool call arguments, the
    text inside tool results; not its ids, roles or JSON."""
    if isinstance(message, dict) and isinstance(message.get("message"), dict):
        message = message["message"]
    texts = []
    for block in message.get("content", ()) if isinstance(message, dict) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("text", "reasoning") and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool-call":
            texts.append(str(block.get("arguments")))
        elif kind == "tool-result":
            texts += [inner["text"] for inner in block.get("content", ())
                      if isinstance(inner, dict) and isinstance(inner.get("text"), str)]
    return texts


def _searchable(data: Any) -> str:
    return "\n".join(message_texts(data)).lower()


def _layout_2_to_3(db: Any) -> None:
    """Layout 2 had no listing columns, usage, findings, dead letters or
    searchable surface text: add them and fill them from each stored view
    and surface row."""
    db.execute(f"ALTER TABLE surface ADD COLUMN {_SURFACE_TEXT}")
    for session_id, seq, data in db.execute("SELECT session_id, seq, data FROM surface").fetchall():
        db.execute("UPDATE surface SET text = ? WHERE session_id = ? AND seq = ?",
                   (_searchable(decode_json(data)), session_id, seq))
    for column in _SESSION_COLUMNS:
        db.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
    for statement in _LISTING:
        db.execute(statement)
    for session_id, view in db.execute("SELECT session_id, view FROM sessions").fetchall():
        _store_listing(db, session_id, decode_json(view))


def _layout_3_to_4(db: Any) -> None:
    """Layout 3 did not fence members: no partition has an owner yet."""
    db.execute(_OWNERS)


def _layout_4_to_5(db: Any) -> None:
    """Layout 4 kept no verdict counts: the index reads them from the topic."""
    db.execute(_VERDICTS)


def _layout_5_to_6(db: Any) -> None:
    """Layout 5 noted each dead letter sent back, not each record: note the
    records those letters came from; and it kept no deleted sessions."""
    db.execute(_DELETED)
    db.execute(_LETTERS_BY_SOURCE)
    records = db.execute(
        "SELECT d.source_topic, d.source_partition, d.source_offset, MIN(r.at) FROM redriven r JOIN dead_letters d "
        "ON d.topic = r.topic AND d.partition = r.partition AND d.\"offset\" = r.\"offset\" "
        "WHERE d.source_topic IS NOT NULL AND d.source_partition IS NOT NULL AND d.source_offset IS NOT NULL "
        "GROUP BY d.source_topic, d.source_partition, d.source_offset").fetchall()
    db.execute("DELETE FROM redriven")
    db.executemany("INSERT INTO redriven (topic, partition, \"offset\", at) VALUES (?, ?, ?, ?)", records)


def _store_listing(db: Any, session_id: str, view: dict[str, Any]) -> None:
    """The listing columns and usage rows of a stored view (the migration's;
    a change writes them with its row)."""
    db.execute("UPDATE sessions SET cwd = ?, created_at = ?, last_activity = ?, turn_count = ?, message_count = ? "
               "WHERE session_id = ?", (*_listing(view, None), session_id))
    store_usage(db, [(session_id, view.get("usage") or ())])


def _listing(view: dict[str, Any], last_activity: int | None) -> tuple:
    """``cwd, created_at, last_activity, turn_count, message_count`` of a
    view (no activity known: its creation)."""
    header = view.get("header") or {}
    return (header.get("cwd"), header.get("createdAt"),
            last_activity if last_activity is not None else header.get("createdAt"), len(view.get("turns") or ()),
            view.get("messageCount", 0))


def store_steps(db: Any, rows: list[tuple[str, StepRow]]) -> None:
    """Replace these step rows (``(session_id, row)`` pairs)."""
    db.executemany(f"INSERT INTO steps (session_id, {', '.join(STEP_COLUMNS)}) "
                   f"VALUES (?, {', '.join('?' * len(STEP_COLUMNS))}) ON CONFLICT (session_id, turn, step) DO UPDATE "
                   "SET " + ", ".join(f"{column} = excluded.{column}" for column in STEP_COLUMNS[2:]),
                   [(session_id, *row) for session_id, row in rows])


def store_usage(db: Any, sessions: Iterable[tuple[str, Iterable[dict[str, Any]]]]) -> None:
    """Replace sessions' usage rows (``(session_id, view's usage)`` pairs)."""
    sessions = list(sessions)
    db.executemany("DELETE FROM usage WHERE session_id = ?", [(session_id,) for session_id, _ in sessions])
    db.executemany(f"INSERT INTO usage (session_id, provider, model, {', '.join(TOKEN_COLUMNS)}) "
                   f"VALUES (?, ?, ?, {', '.join('?' * len(TOKEN_COLUMNS))})",
                   [(session_id, row["provider"], row["model"], *(row.get(kind, 0) for kind in TOKEN_COLUMNS))
                    for session_id, usage in sessions for row in usage])


def _layout_7_to_8(db: Any) -> None:
    """Layout 7 kept no event times: its sessions' last activity was the
    topic's time of their last record. That time becomes their
    ``ingested_at`` and stays their last activity until the session's next
    record (or a rebuild) gives its event time; their surface rows have no
    time and their steps no row until rebuilt. Their tokens are summed."""
    for statement in _EVENT_TIMES:
        db.execute(statement)
    db.execute("UPDATE sessions SET ingested_at = last_activity")
    db.execute("UPDATE sessions SET tokens = COALESCE((SELECT SUM(" + " + ".join(TOKEN_COLUMNS)
               + ") FROM usage u WHERE u.session_id = sessions.session_id), 0)")


def session_tokens(view: dict[str, Any]) -> int:
    """Every token of every kind a view's usage counts."""
    return sum(count for row in view.get("usage") or () for kind in TOKEN_COLUMNS
               if type(count := row.get(kind, 0)) is int and count > 0)


_HEAD_FIELDS = ("nextSeq", "surfaceLength", "replaceGeneration", "turns", "lastTurnEnd", "status", "messagesDigest")

def _layout_6_to_7(db: Any) -> None:
    """Layout 6 held v3/v4 fold snapshots pickled (naming the modules of
    their classes): each is restored once and saved again as fold snapshot
    layout 3, which names none."""
    for (session_id,) in db.execute("SELECT session_id FROM sessions WHERE snapshot IS NOT NULL").fetchall():
        blob = bytes(db.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session_id,)).fetchone()[0])
        if not is_pickled(blob):
            continue
        rows = [(seq, kind, decode_json(data)) for seq, kind, data in db.execute(
            "SELECT seq, type, data FROM surface WHERE session_id = ? ORDER BY seq", (session_id,))]
        fold = restore_fold(blob, f"session {session_id!r}", LogAnalysis(keep_requests=False), rows)
        db.execute("UPDATE sessions SET snapshot = ? WHERE session_id = ?",
                   (snapshot_fold(fold, with_surface_events=False), session_id))


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

    def __init__(self, location: Path | str) -> None:
        """``location``: a SQLite file's path, or a ``postgresql://`` URI
        (:func:`~consumers.runtime.store_location.store_backend`)."""
        migrations = {2: _layout_2_to_3, 3: _layout_3_to_4, 4: _layout_4_to_5, 5: _layout_5_to_6, 6: _layout_6_to_7,
                      7: _layout_7_to_8}
        self.database = (PostgresDatabase(str(location), _KIND, LAYOUT, _SCHEMA, migrations)
                         if store_backend(location) == "postgresql"
                         else Database(Path(location), _KIND, LAYOUT, _SCHEMA, migrations))
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

    def steps(self, session_id: str) -> list[StepRow]:
        """A session's step rows (:data:`~.timings.STEP_COLUMNS`)."""
        return [list(row) for row in self.db.execute(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM steps WHERE session_id = ? ORDER BY turn, step", (session_id,))]

    def load(self, session_id: str) -> SavedSession | None:
        row = self.db.execute("SELECT status, snapshot, error FROM sessions WHERE session_id = ?",
                              (session_id,)).fetchone()
        return None if row is None else (row[0], row[1], row[2], load_held(self.db, session_id))

    def stored(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions have a row (one query per 500 ids)."""
        return _among(self.db, "sessions", session_ids)

    def deleted(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions were deleted (one query per 500 ids)."""
        return _among(self.db, "deleted_sessions", session_ids)

    def digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        """The digest of the record applied at ``seq`` of a session."""
        return applied_digest(self.db, session_id, seq)

    def unacknowledged(self, partitions: Iterable[int]) -> list[tuple[str, int, bytes]]:
        """``(session id, partition, head)`` of the sessions of these
        partitions whose head was never acknowledged."""
        numbers = sorted(partitions)
        rows = self.db.execute(
            "SELECT u.session_id, u.partition, s.view FROM unacknowledged_heads u JOIN sessions s USING (session_id) "
            f"WHERE u.partition IN ({', '.join('?' * len(numbers))})", numbers).fetchall() if numbers else []
        return [(session_id, partition, view_head(decode_json(view))) for session_id, partition, view in rows]

    # -------------------------------------------------------------- writes

    def claim(self, partitions: Iterable[int]) -> dict[int, int]:
        """Take these partitions over: each one's owner epoch goes up, so a
        member that held one before (a replaced member that stalled) can
        write none of its sessions again; returns the new epochs. On
        PostgreSQL this waits for a batch such a member is writing."""
        numbers = sorted(partitions)
        if not numbers:
            return {}
        with self.database.transaction() as db:
            db.executemany("INSERT INTO partition_owners (partition, epoch) VALUES (?, 1) ON CONFLICT (partition) "
                           "DO UPDATE SET epoch = partition_owners.epoch + 1", [(number,) for number in numbers])
            return dict(db.execute("SELECT partition, epoch FROM partition_owners WHERE partition IN "
                                   f"({', '.join('?' * len(numbers))})", numbers).fetchall())

    def write(self, changes: Iterable["SessionChange"], epochs: dict[int, int],
              deletions: dict[str, tuple[int, int]] | None = None) -> set[str]:
        """Store changed sessions in one transaction, each noted as having an
        unacknowledged head, and delete the sessions of ``deletions`` (id:
        its partition and when, ms); a session deleted meanwhile
        (:meth:`delete_session`) is not written again (returned: the
        sessions of ``changes`` not written). All this if ``epochs`` (from
        :meth:`claim`) are still the current ones of their partitions (a
        partition nobody claimed yet has no owner to check); raises
        :class:`FencedError` (nothing written) when a newer member claimed
        one. The check locks the partitions' rows until the commit, so a
        claim cannot come between it and the writes. Rows the store refuses
        for what they hold (a number beyond a 64-bit column, a constraint)
        raise :class:`UnstorableError`, nothing written."""
        changes, deletions = list(changes), deletions or {}
        numbers = sorted({change.partition for change in changes} | {partition for partition, _ in deletions.values()})
        if not numbers:
            return set()
        try:
            with self.database.transaction() as db:
                current = dict(db.execute("UPDATE partition_owners SET epoch = epoch WHERE partition IN "
                                          f"({', '.join('?' * len(numbers))}) RETURNING partition, epoch",
                                          numbers).fetchall())
                taken = [number for number in numbers if current.get(number) != epochs.get(number)]
                if taken:
                    raise FencedError(f"{self.database.where}: events partition {taken[0]} was taken over by a "
                                      f"newer member (store epoch {current.get(taken[0])}, this member's "
                                      f"{epochs.get(taken[0])}); this member stops without writing its batch")
                for session_id, (_, at) in deletions.items():
                    _delete_session(db, session_id, at)
                gone = _among(db, "deleted_sessions", [change.session_id for change in changes])
                _write_changes(db, [change for change in changes if change.session_id not in gone])
        except _ROWS_REFUSED as error:
            named = ", ".join(repr(change.session_id) for change in changes[:3]) + (", ..." if changes[3:] else "")
            raise UnstorableError(f"{self.database.where}: the view store refused the rows of session(s) {named} "
                                  f"(nothing of them written): {type(error).__name__}: {first_line(error)}") from None
        return gone

    def outcome_offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to index, by findings and dead-letter partition."""
        return {(topic, partition): offset for topic, partition, offset in self.db.execute(
            "SELECT topic, partition, next_offset FROM outcome_offsets").fetchall()}

    def index_outcomes(self, findings: list[tuple], letters: list[tuple], verdicts: list[tuple],
                       offsets: dict[tuple[str, int], int]) -> None:
        """Findings, dead-letter and verdict-count rows (:mod:`.outcomes`)
        and the next offsets they bring their partitions to, in one
        transaction; a finding or dead letter already there (the same
        coordinates) is left as it is, a session's counts are replaced by
        later ones."""
        with self.database.transaction() as db:
            # Nothing of a deleted session comes back, but the letters of its records that came after the deletion.
            gone = _among(db, "deleted_sessions", [row[3] for row in findings] + [row[0] for row in verdicts]
                          + [row[9] for row in letters if row[9] is not None])
            if gone:
                findings = [row for row in findings if row[3] not in gone]
                letters = [row for row in letters if row[9] not in gone or row[4] == DeletedSessionError.category]
                verdicts = [row for row in verdicts if row[0] not in gone]
            db.executemany("INSERT INTO findings (topic, partition, \"offset\", session_id, rule, severity, seq, turn, "
                           "step, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                           findings)
            db.executemany("INSERT INTO dead_letters (topic, partition, \"offset\", service, reason, detail, "
                           "source_topic, source_partition, source_offset, session_id, seq, at, size, head) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", letters)
            db.executemany("INSERT INTO audit_verdicts (session_id, counts, topic, partition, \"offset\", at) "
                           "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET counts = excluded.counts, "
                           "topic = excluded.topic, partition = excluded.partition, \"offset\" = excluded.\"offset\", "
                           "at = excluded.at", verdicts)
            db.executemany("INSERT INTO outcome_offsets (topic, partition, next_offset) VALUES (?, ?, ?) "
                           "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
                           [(topic, partition, offset) for (topic, partition), offset in offsets.items()])

    def redriven(self, records: Iterable[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
        """Which of these dead-lettered records (topic, partition, offset
        where first read) were sent back before."""
        return {record for record in records if self.db.execute(
            "SELECT 1 FROM redriven WHERE topic = ? AND partition = ? AND \"offset\" = ?", record).fetchone()}

    def mark_redriven(self, records: Iterable[tuple[str, int, int]], at: int) -> None:
        with self.database.transaction() as db:
            db.executemany("INSERT INTO redriven (topic, partition, \"offset\", at) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT DO NOTHING", [(*record, at) for record in records])

    def delete_session(self, session_id: str, at: int) -> None:
        """Remove every row of a session (its view, listing, surface, held
        records, digests, findings and dead letters) and note it deleted, so
        no row of it is written again."""
        with self.database.transaction() as db:
            _delete_session(db, session_id, at)

    def acknowledged(self, session_ids: list[str]) -> None:
        if session_ids:
            with self.database.transaction() as db:
                db.executemany("DELETE FROM unacknowledged_heads WHERE session_id = ?", [(s,) for s in session_ids])

    def close(self) -> None:
        self.database.close()


@dataclass(frozen=True, slots=True)
class SessionChange:
    """One session's rows as a batch left them (``held``: what changed in
    its held records, ``None``: nothing; ``digests``: of the records
    applied since the last change). Writing one again writes the same rows."""

    session_id: str
    partition: int
    view: dict[str, Any]
    snapshot: bytes | None
    error: str | None
    surface_gone: Iterable[int]
    surface_new: Iterable[tuple[int, str, Any]]
    held: HeldChanges | None
    digests: dict[int, AppliedDigest]
    last_activity: int | None = None  # ms: the newest event time of the records applied
    usage_changed: bool = True  # the view's usage differs from what the store holds
    ingested_at: int | None = None  # ms: when the last record applied was written to the topic
    steps: Iterable[StepRow] = ()  # the step rows changed (:mod:`.timings`)
    surface_times: dict[int, int] | None = None  # the event time of new surface rows, by seq


def _delete_session(db: Any, session_id: str, at: int) -> None:
    for table in _SESSION_TABLES:
        db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
    db.execute("INSERT INTO deleted_sessions (session_id, at) VALUES (?, ?) ON CONFLICT DO NOTHING", (session_id, at))


def _among(db: Any, table: str, session_ids: list[str]) -> set[str]:
    """Which of these sessions have a row in ``table`` (one query per 500 ids)."""
    found: set[str] = set()
    for start in range(0, len(session_ids), 500):
        chunk = session_ids[start:start + 500]
        found.update(row[0] for row in db.execute(
            f"SELECT session_id FROM {table} WHERE session_id IN ({', '.join('?' * len(chunk))})", chunk))
    return found


def _write_changes(db: Any, changes: list[SessionChange]) -> None:
    """A batch's changed sessions, one statement per kind of row however
    many sessions (the driver's work per statement is paid per batch, not
    per session)."""
    db.executemany("DELETE FROM surface WHERE session_id = ? AND seq = ?",
                   [(change.session_id, seq) for change in changes for seq in change.surface_gone])
    db.executemany("INSERT INTO surface (session_id, seq, type, data, text, event_time) VALUES (?, ?, ?, ?, ?, ?)",
                   [(change.session_id, seq, kind, dump_json(data).decode(), _searchable(data),
                     (change.surface_times or {}).get(seq))
                    for change in changes for seq, kind, data in change.surface_new])
    db.executemany("INSERT INTO sessions (session_id, status, next_seq, view, snapshot, error, cwd, created_at, "
                   "last_activity, turn_count, message_count, ingested_at, tokens) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT(session_id) DO UPDATE SET status = excluded.status, next_seq = excluded.next_seq, "
                   "view = excluded.view, snapshot = excluded.snapshot, error = excluded.error, cwd = excluded.cwd, "
                   "created_at = excluded.created_at, last_activity = COALESCE(?, sessions.last_activity, "
                   "excluded.last_activity), turn_count = excluded.turn_count, message_count = excluded.message_count, "
                   "ingested_at = COALESCE(excluded.ingested_at, sessions.ingested_at), tokens = excluded.tokens",
                   [(change.session_id, change.view["status"], change.view["nextSeq"], dump_json(change.view).decode(),
                     change.snapshot, change.error, *_listing(change.view, change.last_activity),
                     change.ingested_at, session_tokens(change.view), change.last_activity) for change in changes])
    store_steps(db, [(change.session_id, row) for change in changes for row in change.steps])
    store_usage(db, [(change.session_id, change.view.get("usage") or ()) for change in changes
                     if change.usage_changed])
    store_held(db, [(change.session_id, change.held) for change in changes if change.held is not None])
    store_digests(db, [(change.session_id, change.digests) for change in changes])
    db.executemany("INSERT INTO unacknowledged_heads (session_id, partition) VALUES (?, ?) "
                   "ON CONFLICT (session_id) DO UPDATE SET partition = excluded.partition",
                   [(change.session_id, change.partition) for change in changes])
