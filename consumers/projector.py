"""The projector: every session's derived, model-visible conversation.

Per session it runs dsh_core's staged fold (legacy upgrades, vocabulary,
seed validation, surface, derivation). ``seq`` is the idempotency key: a
record below the next seq is a duplicate (counted, skipped); one above it is
a gap — the session is held, later records are kept (bounded, persisted),
and the view says so until the missing record arrives and the session
heals. A record the fold refuses marks the session refused and goes to the
dead-letter topic with the refusal's category.

Views live in SQLite (WAL): one transaction per batch writes every changed
session (view, fold snapshot, held records, next seq) before the offsets
are committed, so views are exactly-once. Hot sessions stay in a bounded
LRU; a cold one is restored from its snapshot, and so is one whose
partition was revoked and came back (another member may have moved it
on). View heads go to the compacted ``dsh.session-views`` topic; the same
transaction notes each session whose head is not acknowledged yet, and the
note goes once the batch's offsets are committed (after the heads were
acknowledged). A member that is assigned a partition first publishes the
heads still noted for its sessions, so a crash between the view commit and
the heads' acknowledgement loses no head (the records come back only as
duplicates, which change no view).
"""

from __future__ import annotations

import functools
import sqlite3
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import Counter, Gauge

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DshError
from dsh_core.jsonvalue import decode_json, dump_json
from dsh_kafka.config import ConsumerSettings, KafkaConfig
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord
from dsh_kafka.topics import TopicNames
from dsh_core.fold_snapshot import restore_fold, snapshot_fold
from dsh_core.request import MessagesDigest
from dsh_core.fold import StagedFold

from .runner import HELD_LIMIT, HOT_SESSIONS, ConsumerService, held_limit_error

__all__ = ["Projector", "ViewStore"]

APPLIED = Counter("dsh_projector_events_applied_total", "Session events folded into views.")
DUPLICATES = Counter("dsh_projector_duplicates_total", "Records skipped as already applied (seq below expected).")
GAPS = Counter("dsh_projector_gaps_total", "Records that arrived above the expected seq (session held).")
REFUSED = Counter("dsh_projector_sessions_refused_total", "Sessions whose log was refused, by category.", ["category"])
SKIPPED = Counter("dsh_projector_records_skipped_total", "Records not applied, by reason.", ["reason"])
REPUBLISHED = Counter("dsh_projector_heads_republished_total",
                      "View heads published again on assignment (a crash left them unacknowledged).")
SESSIONS = Gauge("dsh_projector_sessions", "Sessions by state (hot in memory, held at a gap).", ["state"])
TOKENS = Counter("dsh_tokens_total", "Tokens reported by assistant messages, by provider, model and kind.",
                 ["provider", "model", "kind"])
TURN_ENDS = Counter("dsh_turn_ends_total", "Turns ended, by end reason.", ["reason"])

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, status TEXT NOT NULL, next_seq INTEGER NOT NULL,
    view TEXT NOT NULL, snapshot BLOB, error TEXT);
CREATE TABLE IF NOT EXISTS surface (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (session_id, seq));
CREATE TABLE IF NOT EXISTS held (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, value BLOB NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq));
CREATE TABLE IF NOT EXISTS unacknowledged_heads (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL);
"""

_HEAD_FIELDS = ("nextSeq", "surfaceLength", "replaceGeneration", "turns", "lastTurnEnd", "status", "messagesDigest")


def view_head(view: dict[str, Any]) -> bytes:
    """The ``dsh.session-views`` value of a view."""
    head = {field: view.get(field) for field in _HEAD_FIELDS}
    head["seq"] = head.pop("nextSeq")
    head["turns"] = len(head["turns"] or ())
    return dump_json(head)


class ViewStore:
    """The SQLite view store (WAL): one writer, readers any time."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def load(self, session_id: str) -> tuple[str, bytes | None, str | None, list[tuple[int, bytes, int]]] | None:
        row = self.db.execute("SELECT status, snapshot, error FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            return None
        held = self.db.execute("SELECT seq, value, count FROM held WHERE session_id = ? ORDER BY seq",
                               (session_id,)).fetchall()
        return row[0], row[1], row[2], held

    def surface_events(self, session_id: str) -> list[tuple[int, str, Any]]:
        """The stored current surface events of a session (its checkpoint rows)."""
        return [(seq, kind, decode_json(data)) for seq, kind, data in self.db.execute(
            "SELECT seq, type, data FROM surface WHERE session_id = ? ORDER BY seq", (session_id,))]

    def fold(self, session_id: str, analysis: LogAnalysis | None = None) -> StagedFold | None:
        """A session's fold restored from its checkpoint and surface rows."""
        blob = self.snapshot(session_id)
        if blob is None:
            return None
        return restore_fold(blob, f"session {session_id!r}", analysis, self.surface_events(session_id))

    def view(self, session_id: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT view FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else decode_json(row[0])

    def snapshot(self, session_id: str) -> bytes | None:
        row = self.db.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else row[0]

    def session_ids(self) -> list[str]:
        return [row[0] for row in self.db.execute("SELECT session_id FROM sessions ORDER BY session_id")]

    def close(self) -> None:
        self.db.close()


# Label lookups cost more than the increments (one per assistant message).
_turn_ends = functools.lru_cache(maxsize=256)(TURN_ENDS.labels)
_tokens = functools.lru_cache(maxsize=4096)(TOKENS.labels)


def _count_turn_end(reason: Any) -> None:
    _turn_ends(str(reason.get("kind")) if isinstance(reason, dict) else "unknown").inc()


def _count_usage(provider: str, model: str, counted: dict[str, int]) -> None:
    for kind, value in counted.items():
        _tokens(provider, model, kind).inc(value)


def _analysis() -> LogAnalysis:
    return LogAnalysis(keep_requests=False, on_turn_end=_count_turn_end, on_usage=_count_usage, count_requests=False)


@dataclass
class _Session:
    session_id: str
    partition: int
    fold: StagedFold | None = None
    analysis: LogAnalysis = field(default_factory=_analysis)
    status: str = "open"
    error: str | None = None
    held: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    held_dirty: bool = False
    digest: MessagesDigest = field(default_factory=MessagesDigest)
    stored_surface: set[int] = field(default_factory=set)  # seqs with a row in the surface table


class Projector(ConsumerService):
    service = "projector"

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, store_path: Path, *, group: str = "dsh-projector",
                 hot_sessions: int = HOT_SESSIONS, settings: ConsumerSettings | None = None) -> None:
        super().__init__(kafka, topics, settings or ConsumerSettings(group_id=group))
        self.store_path = store_path
        self.hot_sessions = hot_sessions
        self.store: ViewStore | None = None
        self._hot: OrderedDict[str, _Session] = OrderedDict()
        self._dirty: dict[str, _Session] = {}
        self._unacknowledged: list[str] = []  # sessions whose heads the commit in flight covers

    async def open(self) -> None:
        self.store = ViewStore(self.store_path)

    async def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    # ------------------------------------------------------------- sessions

    def _session(self, session_id: str, partition: int) -> _Session:
        session = self._hot.get(session_id)
        if session is not None:
            self._hot.move_to_end(session_id)
            return session
        session = _Session(session_id, partition)
        saved = self.store.load(session_id) if self.store else None
        if saved is not None:
            status, blob, error, held = saved
            session.status, session.error = status, error
            if blob is not None:
                rows = self.store.surface_events(session_id)
                session.fold = restore_fold(blob, f"session {session_id!r}", session.analysis, rows)
                session.stored_surface = {seq for seq, _, _ in rows}
            session.held = {seq: (value, count) for seq, value, count in held}
        self._hot[session_id] = session
        return session

    def _expected(self, session: _Session) -> int:
        return session.fold.count if session.fold is not None else 0

    async def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            SKIPPED.labels("attestation").inc()
            return
        session = self._session(decoded.session_id, record.partition)
        if session.status == "refused":
            SKIPPED.labels("session-refused").inc()
            return
        if decoded.kind == KIND_HEADER:
            if session.fold is not None:
                self.count(DUPLICATES)
                return
            fold = StagedFold(f"session {decoded.session_id!r}", session.analysis)
            try:
                fold.header_line(decoded.value)
            except DshError as error:
                self._refuse(session, error)
                raise
            session.fold = fold
            self._mark(session)
            await self._drain(session, record)
            return
        expected = self._expected(session)
        if decoded.seq < expected:
            self.count(DUPLICATES)
            return
        if decoded.seq > expected or session.fold is None:
            if decoded.seq not in session.held:
                self.count(GAPS)
                if len(session.held) >= HELD_LIMIT:
                    SKIPPED.labels("held-limit").inc()
                    raise held_limit_error(decoded.session_id, expected, decoded.seq)
                session.held[decoded.seq] = (decoded.value, decoded.count)
                session.held_dirty = True
            session.status = "held"
            self._mark(session)
            return
        self._apply(session, decoded.value, record)
        await self._drain(session, record)

    def _apply(self, session: _Session, value: bytes, record: KafkaRecord) -> None:
        fold = session.fold
        before = fold.count
        fold.apply(value)  # DecodeError propagates to the error policy
        if fold.error is not None:
            self._refuse(session, fold.error)
            raise fold.error
        self.count(APPLIED, fold.count - before)
        self._mark(session)

    async def _drain(self, session: _Session, record: KafkaRecord) -> None:
        """Apply held records that now continue the log; heal the session."""
        while session.held and session.fold is not None:
            expected = self._expected(session)
            for seq in [s for s in session.held if s < expected]:
                del session.held[seq]
                session.held_dirty = True
            item = session.held.pop(expected, None)
            if item is None:
                break
            session.held_dirty = True
            self._apply(session, item[0], record)
        if session.status == "held" and not session.held:
            session.status = "open"
            self._mark(session)

    def _refuse(self, session: _Session, error: DshError) -> None:
        session.status = "refused"
        session.error = f"[{error.category}] {type(error).__name__}: {error.message}"
        REFUSED.labels(error.category).inc()
        self._mark(session)

    def _mark(self, session: _Session) -> None:
        self._dirty[session.session_id] = session

    # -------------------------------------------------------------- persist

    def _view(self, session: _Session) -> dict[str, Any]:
        fold, analysis = session.fold, session.analysis
        turns = analysis.turns
        view: dict[str, Any] = {"sessionId": session.session_id, "status": session.status,
                                "header": fold.header.to_dict() if fold is not None and fold.header else None,
                                "nextSeq": self._expected(session), "turns": turns,
                                "lastTurnEnd": turns[-1]["reason"] if turns else None,
                                "usage": [{"provider": p, "model": m, **dict(t)} for (p, m), t in analysis.usage.items()]}
        if fold is not None:
            surface = fold.state.surface
            messages = fold.state.current_messages()
            view |= {"surfaceLength": len(surface.nodes), "replaceGeneration": surface.replace_generation,
                     "messageCount": len(messages),
                     "messagesDigest": session.digest.of(messages, surface.replace_generation),
                     "requestHeader": fold.state.header, "requestContext": fold.state.context}
        if session.status == "held":
            view["heldFrom"] = self._expected(session)
            view["heldRecords"] = len(session.held)
        if session.error:
            view["error"] = session.error
        if fold is not None and fold.tracker.open_turn is None and session.status == "open":
            view["status"] = "idle"
        return view

    async def persist(self) -> None:
        if not self._dirty or self.store is None:
            return
        db = self.store.db
        heads = []
        db.execute("BEGIN IMMEDIATE")
        try:
            for session in self._dirty.values():
                view = self._view(session)
                snapshot = snapshot_fold(session.fold, with_surface_events=False) if session.fold is not None else None
                if session.fold is not None:  # surface rows change by difference, never rewritten
                    current = session.fold.state.surface_events()
                    gone = session.stored_surface - current.keys()
                    new = current.keys() - session.stored_surface
                    db.executemany("DELETE FROM surface WHERE session_id = ? AND seq = ?",
                                   [(session.session_id, seq) for seq in gone])
                    db.executemany("INSERT INTO surface (session_id, seq, type, data) VALUES (?, ?, ?, ?)",
                                   [(session.session_id, seq, current[seq][0], dump_json(current[seq][1]).decode())
                                    for seq in new])
                    session.stored_surface = set(current)
                db.execute("INSERT INTO sessions (session_id, status, next_seq, view, snapshot, error) "
                           "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET status=excluded.status, "
                           "next_seq=excluded.next_seq, view=excluded.view, snapshot=excluded.snapshot, "
                           "error=excluded.error",
                           (session.session_id, view["status"], view["nextSeq"], dump_json(view).decode(), snapshot,
                            session.error))
                if session.held_dirty:
                    db.execute("DELETE FROM held WHERE session_id = ?", (session.session_id,))
                    db.executemany("INSERT INTO held (session_id, seq, value, count) VALUES (?, ?, ?, ?)",
                                   [(session.session_id, seq, value, count) for seq, (value, count) in session.held.items()])
                    session.held_dirty = False
                heads.append((session.session_id, view_head(view)))
            db.executemany("INSERT OR REPLACE INTO unacknowledged_heads (session_id, partition) VALUES (?, ?)",
                           [(session.session_id, session.partition) for session in self._dirty.values()])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._dirty.clear()
        for session_id, head in heads:
            await self.producer.send(self.topics.views, key=session_id.encode(), value=head)
        self._unacknowledged.extend(session_id for session_id, _ in heads)
        self._evict()  # the runner waits for the heads' acknowledgement before committing offsets

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await super().commit(offsets)  # the batch's heads were acknowledged before
        self._acknowledged(self._unacknowledged)
        self._unacknowledged = []

    def _acknowledged(self, session_ids: list[str]) -> None:
        if not session_ids:
            return
        db = self.store.db
        db.execute("BEGIN IMMEDIATE")
        db.executemany("DELETE FROM unacknowledged_heads WHERE session_id = ?", [(s,) for s in session_ids])
        db.execute("COMMIT")

    async def on_assign(self, partitions: set[TopicPartition]) -> None:
        """Publish the heads a crash left unacknowledged for these partitions'
        sessions (their views are committed; their records come back only
        as duplicates)."""
        numbers = sorted(tp.partition for tp in partitions)
        if not numbers:
            return
        rows = self.store.db.execute(
            "SELECT u.session_id, s.view FROM unacknowledged_heads u JOIN sessions s USING (session_id) "
            f"WHERE u.partition IN ({', '.join('?' * len(numbers))})", numbers).fetchall()
        if not rows:
            return
        for session_id, view in rows:
            await self.producer.send(self.topics.views, key=session_id.encode(), value=view_head(decode_json(view)))
        await self.producer.flush()
        self._acknowledged([session_id for session_id, _ in rows])
        REPUBLISHED.inc(len(rows))

    async def on_revoke(self, partitions: set[TopicPartition]) -> None:
        # Another member continues these sessions in the store: what this
        # one knows of them is stale once they come back.
        gone = {tp.partition for tp in partitions}
        for session_id in [s for s, session in self._hot.items() if session.partition in gone]:
            del self._hot[session_id]
        SESSIONS.labels("hot").set(len(self._hot))

    def _evict(self) -> None:
        while len(self._hot) > self.hot_sessions:
            self._hot.popitem(last=False)
        SESSIONS.labels("hot").set(len(self._hot))
        SESSIONS.labels("held").set(sum(1 for s in self._hot.values() if s.status == "held"))
