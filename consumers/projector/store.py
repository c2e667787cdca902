"""The projector's view store, on any backend of
:mod:`~consumers.runtime.store_backends` (a SQLite file, the embedded
default; a PostgreSQL database, for projectors on many hosts in one
group; this process's memory, for tests). Every statement that writes it
is here; its tables are :mod:`.store_schema`'s (documented in
docs/reference/view-store.md), older layouts are migrated by
:mod:`.store_migrations`.

``sessions`` holds each session's view (JSON), fold snapshot and status,
and the columns sessions are listed and filtered by (cwd, creation, last
activity, turn and message counts, tokens); creation and last activity are
the log's own event times (:mod:`dsh_core.event_time`), and
``ingested_at`` when the last record applied was written to the topic;
``usage`` its token totals by provider and model; ``steps`` each step's
event times and tokens (:mod:`.timings`); ``gateway_requests`` the
requests gateways attested (:mod:`.gateway_requests`); ``surface`` its current surface
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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DeletedSessionError, UnstorableError
from dsh_core.formats import SessionFold
from dsh_core.fold_snapshot import restore_fold
from dsh_core.jsonvalue import decode_json, dump_json
from dsh_kafka.errors import FencedError

from ..runtime.database import applied_digest, first_line, load_held, store_digests, store_held
from ..runtime.sequencing import AppliedDigest, HeldChanges
from ..runtime.store_backends import backend_of
from .gateway_requests import REQUEST_COLUMNS, RequestRow
from .store_migrations import MIGRATIONS
from .store_schema import KIND, LAYOUT, SCHEMA, SESSION_TABLES, TOKEN_COLUMNS, listing, message_texts, searchable, \
    session_tokens, store_steps, store_usage
from .timings import STEP_COLUMNS, StepRow

__all__ = ["LAYOUT", "SavedSession", "SessionChange", "TOKEN_COLUMNS", "ViewStore", "message_texts", "view_head"]

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

    def __init__(self, location: Path | str) -> None:
        """``location``: a SQLite file's path, or a URI of a backend's
        scheme (:func:`~consumers.runtime.store_backends.backend_of`)."""
        self.backend = backend_of(location)
        self.database = self.backend.open(location, KIND, LAYOUT, SCHEMA, MIGRATIONS)
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
              deletions: dict[str, tuple[int, int]] | None = None,
              requests: Iterable[tuple[str, int, RequestRow]] = ()) -> set[str]:
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
        raise :class:`UnstorableError`, nothing written. ``requests``
        (session id, partition, row: :mod:`.gateway_requests`) are the
        gateway requests of the batch, written with them (one already
        there stays as it is)."""
        changes, deletions, requests = list(changes), deletions or {}, list(requests)
        numbers = sorted({change.partition for change in changes} | {partition for partition, _ in deletions.values()}
                         | {partition for _, partition, _ in requests})
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
                kept = _among(db, "deleted_sessions", [session_id for session_id, _, _ in requests])
                db.executemany(f"INSERT INTO gateway_requests (session_id, {', '.join(REQUEST_COLUMNS)}) VALUES "
                               f"(?, {', '.join('?' * len(REQUEST_COLUMNS))}) ON CONFLICT DO NOTHING",
                               [(session_id, *row) for session_id, _, row in requests if session_id not in kept])
        except self.backend.rows_refused as error:
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
    for table in SESSION_TABLES:
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
                   [(change.session_id, seq, kind, dump_json(data).decode(), searchable(data),
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
                     change.snapshot, change.error, *listing(change.view, change.last_activity),
                     change.ingested_at, session_tokens(change.view), change.last_activity) for change in changes])
    store_steps(db, [(change.session_id, row) for change in changes for row in change.steps])
    store_usage(db, [(change.session_id, change.view.get("usage") or ()) for change in changes
                     if change.usage_changed])
    store_held(db, [(change.session_id, change.held) for change in changes if change.held is not None])
    store_digests(db, [(change.session_id, change.digests) for change in changes])
    db.executemany("INSERT INTO unacknowledged_heads (session_id, partition) VALUES (?, ?) "
                   "ON CONFLICT (session_id) DO UPDATE SET partition = excluded.partition",
                   [(change.session_id, change.partition) for change in changes])
