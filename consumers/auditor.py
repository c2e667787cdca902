"""The auditor: proves, as records arrive, that every model request was
rebuildable from the log, and checks what the log itself promises.

Per session it runs dsh_core's staged fold and the streaming invariant
checker. Findings (one record each on ``dsh.audit-findings``, and a metric):

* ``request-mismatch`` — an attestation's digest differs from the request
  rebuilt from the log prefix below its ``boundarySeq``;
* ``attestation-late`` — an attestation arrived after events at or beyond
  its boundary (the prefix can no longer be rebuilt);
* ``no-request-header`` / ``empty-history`` — a request boundary with no
  request header in force, or with nothing to send;
* ``sequence-gap`` — a record above the next seq, or before the session
  header (the session is held until the missing record arrives; at most
  ``HELD_LIMIT`` records, later ones are dead-lettered);
* ``lossless`` — a record whose JSON would not survive a round trip
  (integers beyond 2^53, negative zero);
* ``unsupported-format`` / ``invalid-log`` / ``corrupt-storage`` — the
  session's log is refused (unknown required type, broken rule, bad record);
* ``invariant:<rule>`` — a turn/step/tool relation of spec §7.1 is broken.

Exactly-once findings: a partition's findings, dead letters and consumer
offsets of each batch are committed in one Kafka transaction by that
partition's own transactional producer (transactional id
``<group>.<topic>.<partition>``). A member that takes a partition over
initializes that id first, which aborts the previous owner's open
transaction and fences it: a zombie member (one the group already replaced)
can commit nothing more, and fails.

Session state lives in a bounded LRU backed by a SQLite state store that
only ever holds *committed* state: a session the LRU evicts is written once
the commit covering it has landed, and every ``checkpoint_seconds`` (and on
revoke and clean shutdown) each changed session is written together with
its partition's committed offset. On assignment the auditor replays the
partition from that stored offset (from offset 0 without one) up to the
committed offset with findings muted, loading stored sessions as their
records appear; a stored session already past a replayed record skips it as
a duplicate. So a restart neither repeats nor loses a finding, and replays
at most one checkpoint interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Iterable, Iterator

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced
from prometheus_client import Counter, Gauge

from dsh_core.errors import DecodeError, DshError, FencedError, StateStoreError
from dsh_core.invariants import InvariantChecker
from dsh_core.fold_snapshot import restore_fold, snapshot_fold
from dsh_core.jsonvalue import MAX_SAFE_INTEGER, decode_json, dump_json, encode_json
from dsh_kafka.clients import make_consumer, make_producer
from dsh_kafka.config import SERVICE_PRODUCER, ConsumerSettings, KafkaConfig
from dsh_kafka.records import KIND_ATTESTATION, KIND_HEADER, KafkaRecord, SessionRecord, decode_kafka_record
from dsh_kafka.topics import TopicNames
from dsh_core.request import Boundary, BoundaryTracker, MessagesDigest, request_frame
from dsh_core.session import SessionState
from dsh_core.fold import StagedFold
from dsh_core.storage.records import ChunkRow

from .runner import HELD_LIMIT, HOT_SESSIONS, ConsumerService, held_limit_error

__all__ = ["Auditor", "AuditStore", "FencedError", "Finding", "StateStoreError", "lossless_problem"]

FINDINGS = Counter("dsh_audit_findings_total", "Audit findings, by rule.", ["rule"])
REQUESTS = Counter("dsh_audit_requests_total", "Attested requests checked, by verdict.", ["verdict"])
PENDING = Gauge("dsh_audit_attestations_pending", "Attestations waiting for the events below their boundary.")
AUDITED = Counter("dsh_audit_events_total", "Session events audited.")
AUDIT_SESSIONS = Gauge("dsh_audit_sessions", "Sessions held in memory by the auditor.")
REPLAYED = Counter("dsh_audit_replayed_records_total", "Records replayed (findings muted) to rebuild state on assignment.")
STORE_WRITES = Counter("dsh_audit_state_writes_total", "Session states written to the auditor's state store.")

_INVARIANT_TYPES = frozenset({"turn/start", "turn/end", "step/start", "step/end", "assistant/chunk",
                              "assistant/message", "tool/call", "tool/result", "todo/write", "request/header",
                              "request/context"})
# Pre-filter, a C-speed scan of the whole value (a per-byte regex costs more
# than the fold): digits become '0', '-' stays, a byte that can end a number
# token ('.', 'e', 'E', ',', ']', '}', whitespace) a space, any other 'x'; then
# a "-0" before a space or at the end (a possible negative zero) or a run of
# 16 digits (an integer that may exceed 2^53) sends the value to the exact check.
_NUMBER_SKELETON = bytes(0x30 if 0x30 <= byte <= 0x39 else byte if byte == 0x2D else
                         0x20 if byte in b".eE,]} \t\r\n" else 0x78 for byte in range(256))
_SIXTEEN_DIGITS = b"0" * 16


# The error category each rule belongs to (the corpus's categories where
# they apply): dead letters and findings can be matched to a refusal class.
_CATEGORY = {"sequence-gap": "corrupt-storage", "corrupt-storage": "corrupt-storage",
             "unsupported-format": "unsupported-format", "invalid-log": "invalid-log", "lossless": "invalid-log"}


async def _all(awaitables: Iterable[Awaitable[Any]]) -> None:
    """Await every one (none is left running or unretrieved), then raise the
    first failure."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure


@dataclass(frozen=True)
class Finding:
    rule: str
    session: str
    seq: Any
    detail: str
    turn: Any = None
    step: Any = None
    severity: str = "error"

    def to_json(self) -> bytes:
        category = _CATEGORY.get(self.rule, "invariant" if self.rule.startswith("invariant:") else "reconstruction")
        return encode_json({"rule": self.rule, "category": category, "severity": self.severity,
                            "session": self.session, "seq": self.seq, "turn": self.turn, "step": self.step,
                            "detail": self.detail})


def lossless_problem(value: bytes) -> str | None:
    """What in a record's JSON would not survive a round trip, if anything."""
    skeleton = value.translate(_NUMBER_SKELETON)
    if b"-0 " not in skeleton and not skeleton.endswith(b"-0") and _SIXTEEN_DIGITS not in skeleton:
        return None
    found: list[str] = []

    def number(text: str) -> Any:
        if text.lstrip("-").isdigit():
            parsed = int(text)
            if parsed == 0 and text.startswith("-"):
                found.append(f"negative zero {text}")
            elif abs(parsed) > MAX_SAFE_INTEGER:
                found.append(f"integer {text} is outside ±(2^53-1)")
            return parsed
        parsed_float = float(text)
        if parsed_float == 0 and text.startswith("-"):
            found.append(f"negative zero {text}")
        return parsed_float

    try:
        json.loads(value, parse_int=number, parse_float=number)
    except ValueError:
        return None  # not JSON at all: the fold refuses it with a better reason
    return "; ".join(found) or None


class _BoundaryAudit:
    """Fold observer: request boundaries and invariants of one session."""

    watched_types = _INVARIANT_TYPES

    def __init__(self, session: "_Session", boundaries: BoundaryTracker | None = None,
                 invariants: InvariantChecker | None = None) -> None:
        self.session = session
        self.boundaries = boundaries or BoundaryTracker()
        self.invariants = invariants or InvariantChecker()

    def _boundary(self, boundary: Boundary | None, state: SessionState) -> None:
        if boundary is None:
            return
        if boundary.seq in self.session.attested:
            return
        if state.header is None:
            self.session.emit("no-request-header", boundary.seq, "a model request with no request/header in force",
                              boundary.turn, boundary.step)
        elif state.message_count() == 0:
            self.session.emit("empty-history", boundary.seq, "a model request with no derived messages",
                              boundary.turn, boundary.step)

    def before_event(self, event: dict[str, Any], state: SessionState) -> None:
        if event["type"] in ("assistant/chunk", "assistant/message") and isinstance(event["data"], dict):
            self._boundary(self.boundaries.observe(event["type"], event["seq"], event["data"]), state)

    def after_event(self, event: dict[str, Any], state: SessionState) -> None:
        for violation in self.invariants.check(event["type"], event["seq"], event["data"],
                                               event.get("surfaceOp", "append")):
            self.session.emit(f"invariant:{violation.rule}", violation.seq, violation.detail, violation.turn,
                              violation.step)

    def chunk_run(self, row: ChunkRow, state: SessionState) -> None:
        self._boundary(self.boundaries.observe_delta_run(row.turn, row.step, row.seq0), state)
        for violation in self.invariants.check_chunk_run(row.turn, row.step, row.seq0, row.count):
            self.session.emit(f"invariant:{violation.rule}", violation.seq, violation.detail, violation.turn,
                              violation.step)


@dataclass
class _Session:
    session_id: str
    partition: int
    auditor: "Auditor"
    fold: StagedFold | None = None
    refused: bool = False
    held: dict[int, bytes] = field(default_factory=dict)
    gap_reported: int | None = None
    pending: dict[int, bytes] = field(default_factory=dict)  # attestation values by boundary seq
    attested: set[int] = field(default_factory=set)  # verified boundaries the fold has not passed yet
    request_digest: MessagesDigest = field(default_factory=MessagesDigest)
    frame_header: Any = None  # the request header the frame below was built from
    frame: tuple[bytes, bytes] = (b"", b"")

    def emit(self, rule: str, seq: Any, detail: str, turn: Any = None, step: Any = None) -> None:
        self.auditor.emit(Finding(rule, self.session_id, seq, detail, turn, step), self.partition)

    def snapshot(self) -> "_Saved":
        """Everything later records need, for the state store."""
        fold = self.fold
        state: dict[str, Any] = {"refused": self.refused, "gapReported": self.gap_reported}
        if fold is not None:
            self.attested = {seq for seq in self.attested if seq >= fold.count}
            state |= {"attested": sorted(self.attested), "boundaries": fold.observer.boundaries.to_json(),
                      "invariants": fold.observer.invariants.to_json()}
        return _Saved(self.partition, snapshot_fold(fold) if fold is not None else None, dump_json(state),
                      dict(self.held), dict(self.pending))

    @classmethod
    def restore(cls, session_id: str, saved: "_Saved", auditor: "Auditor") -> "_Session":
        session = cls(session_id, saved.partition, auditor, held=dict(saved.held), pending=dict(saved.pending))
        state = decode_json(saved.state)
        session.refused, session.gap_reported = state["refused"], state["gapReported"]
        if saved.fold is not None:
            observer = _BoundaryAudit(session, BoundaryTracker.from_json(state["boundaries"]),
                                      InvariantChecker.from_json(state["invariants"]))
            session.fold = restore_fold(saved.fold, f"session {session_id!r}", observer)
            session.attested = set(state["attested"])
        return session


@dataclass(frozen=True)
class _Saved:
    """One session's stored state."""

    partition: int
    fold: bytes | None
    state: bytes
    held: dict[int, bytes]
    pending: dict[int, bytes]


_STORE_LAYOUT = 2  # PRAGMA user_version of the layout below
_STORE_SCHEMA = (
    "CREATE TABLE owner (singleton INTEGER PRIMARY KEY CHECK (singleton = 0), group_id TEXT NOT NULL, topic TEXT NOT NULL)",
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL, fold BLOB, state BLOB NOT NULL)",
    "CREATE TABLE records (session_id TEXT NOT NULL, kind TEXT NOT NULL, seq INTEGER NOT NULL, value BLOB NOT NULL, "
    "PRIMARY KEY (session_id, kind, seq))",
    "CREATE TABLE partitions (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL)",
)


class AuditStore:
    """The auditor's SQLite state store (WAL) of one consumer group on one
    topic. It holds committed state only: ``partitions`` says up to which
    offset every session of a partition is stored; a session row may be
    further along (written when evicted), never beyond the partition's
    committed offset. ``None`` keeps it in memory."""

    def __init__(self, path: Path | None, group: str, topic: str) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(":memory:" if path is None else path, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._claim(str(path or ":memory:"), group, topic)
        except BaseException:
            self.db.close()
            raise

    def _claim(self, where: str, group: str, topic: str) -> None:
        """Create the layout in an empty file; refuse another group's, another
        topic's or another layout's file (its offsets mean nothing here)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                for statement in _STORE_SCHEMA:
                    db.execute(statement)
                db.execute("INSERT INTO owner VALUES (0, ?, ?)", (group, topic))
                db.execute(f"PRAGMA user_version = {_STORE_LAYOUT}")
            layout = db.execute("PRAGMA user_version").fetchone()[0]
            if layout != _STORE_LAYOUT:
                raise StateStoreError(f"{where}: auditor state in layout {layout}, this auditor writes layout "
                                      f"{_STORE_LAYOUT}; remove the file (the auditor rebuilds it by replaying)")
            owner = db.execute("SELECT group_id, topic FROM owner").fetchone()
            if owner != (group, topic):
                raise StateStoreError(f"{where}: auditor state of group {owner[0]!r} on {owner[1]!r}, not of group "
                                      f"{group!r} on {topic!r}; give each group and topic its own --state")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def load(self, session_id: str) -> _Saved | None:
        row = self.db.execute("SELECT partition, fold, state FROM sessions WHERE session_id = ?",
                              (session_id,)).fetchone()
        if row is None:
            return None
        records: dict[str, dict[int, bytes]] = {"held": {}, "attestation": {}}
        for kind, seq, value in self.db.execute("SELECT kind, seq, value FROM records WHERE session_id = ?",
                                                (session_id,)):
            records[kind][seq] = value
        return _Saved(row[0], row[1], row[2], records["held"], records["attestation"])

    def stored_offset(self, partition: int) -> int | None:
        row = self.db.execute("SELECT next_offset FROM partitions WHERE partition = ?", (partition,)).fetchone()
        return None if row is None else row[0]

    def write(self, sessions: dict[str, _Saved], offsets: dict[int, int]) -> None:
        """Store session states and, for partitions whose every changed
        session is among them, the offset they are all stored up to."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for session_id, saved in sessions.items():
                db.execute("INSERT OR REPLACE INTO sessions (session_id, partition, fold, state) VALUES (?, ?, ?, ?)",
                           (session_id, saved.partition, saved.fold, saved.state))
                db.execute("DELETE FROM records WHERE session_id = ?", (session_id,))
                db.executemany("INSERT INTO records (session_id, kind, seq, value) VALUES (?, ?, ?, ?)",
                               [(session_id, "held", seq, value) for seq, value in saved.held.items()]
                               + [(session_id, "attestation", seq, value) for seq, value in saved.pending.items()])
            db.executemany("INSERT OR REPLACE INTO partitions (partition, next_offset) VALUES (?, ?)",
                           list(offsets.items()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        STORE_WRITES.inc(len(sessions))

    def forget(self, partition: int) -> None:
        """Drop a partition's stored state (it is ahead of the committed offset)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM records WHERE session_id IN (SELECT session_id FROM sessions WHERE partition = ?)",
                   (partition,))
        db.execute("DELETE FROM sessions WHERE partition = ?", (partition,))
        db.execute("DELETE FROM partitions WHERE partition = ?", (partition,))
        db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


class Auditor(ConsumerService):
    service = "auditor"

    def __init__(self, kafka: KafkaConfig, topics: TopicNames, *, state: Path | None = None,
                 group: str = "dsh-auditor", hot_sessions: int = HOT_SESSIONS,
                 checkpoint_seconds: float = 30.0, settings: ConsumerSettings | None = None) -> None:
        super().__init__(kafka, topics, settings or ConsumerSettings(group_id=group))
        self.state_path = state
        self.hot_sessions = hot_sessions
        self.checkpoint_seconds = checkpoint_seconds
        self.store: AuditStore | None = None
        self.replayed = 0  # records replayed on assignment
        self._hot: OrderedDict[str, _Session] = OrderedDict()
        self._changed: dict[str, _Session] = {}  # since their last store write
        self._staged: dict[str, _Saved] = {}  # stored once the commit in flight lands
        self._staged_checkpoint = False  # ... together with every partition's offset
        self._next_checkpoint = time.monotonic() + checkpoint_seconds
        self._pending_gauge_due = 0.0
        self._committed: dict[TopicPartition, int] = {}
        self._findings: list[tuple[int, Finding]] = []  # with the partition of the record that raised it
        self._dead_letters: list[tuple[KafkaRecord, DshError]] = []
        self._muted = False
        self._transactions: dict[TopicPartition, AIOKafkaProducer] = {}  # one producer per assigned partition
        self._open: set[TopicPartition] = set()  # partitions whose transaction has begun

    def make_producer(self) -> None:
        return None  # every output goes through a partition's transactional producer

    def transactional_id(self, partition: TopicPartition) -> str:
        return f"{self.settings.group_id}.{partition.topic}.{partition.partition}"

    async def open(self) -> None:
        self.store = AuditStore(self.state_path, self.settings.group_id, self.topics.events)

    async def close(self) -> None:
        try:
            await self._stop_producers(set(self._transactions))
        finally:
            if self.store is not None:
                try:
                    if self.drained:  # after a failure, memory may hold a half-applied record
                        self._store_now(set(self._committed))
                finally:
                    self.store.close()
                    self.store = None

    # ---------------------------------------------------------- transactions
    #
    # Handling a batch sends nothing: its findings and dead letters wait for
    # persist, which opens the partitions' transactions once the previous
    # ones have committed (the runner awaits that commit first). So the
    # commit of one batch overlaps the handling of the next, and no record
    # joins the wrong transaction.

    async def _start_producers(self, partitions: set[TopicPartition]) -> None:
        """Initialize each partition's transactional id: this aborts the
        transaction a previous owner left open and fences that owner."""
        async def start(partition: TopicPartition) -> None:
            producer = make_producer(self.kafka, SERVICE_PRODUCER, transactional_id=self.transactional_id(partition))
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._transactions[partition] = producer
        await _all(start(p) for p in partitions if p not in self._transactions)

    async def _stop_producers(self, partitions: set[TopicPartition]) -> None:
        producers = [self._transactions.pop(p) for p in partitions if p in self._transactions]
        self._open -= partitions
        await _all(producer.stop() for producer in producers)

    async def _transaction(self, partition: TopicPartition) -> AIOKafkaProducer:
        """The partition's producer, inside a transaction."""
        producer = self._transactions[partition]
        if partition not in self._open:
            await producer.begin_transaction()
            self._open.add(partition)
        return producer

    async def dead_letter(self, record: KafkaRecord, error: DshError) -> None:
        self._dead_letters.append((record, error))

    def emit(self, finding: Finding, partition: int) -> None:
        if not self._muted:
            self._findings.append((partition, finding))

    async def persist(self) -> None:
        if self._findings or self._dead_letters:
            outputs: dict[TopicPartition, list[Any]] = {}
            for record, error in self._dead_letters:
                outputs.setdefault(TopicPartition(record.topic, record.partition), []).append((record, error))
            for partition, finding in self._findings:
                outputs.setdefault(TopicPartition(self.topics.events, partition), []).append(finding)
            self._dead_letters = []
            findings, self._findings = self._findings, []
            await _all(self._send_outputs(partition, items) for partition, items in outputs.items())
            for _, finding in findings:
                FINDINGS.labels(finding.rule).inc()
        # Memory now holds exactly the state the coming commit covers.
        if time.monotonic() >= self._next_checkpoint:
            self._next_checkpoint = time.monotonic() + self.checkpoint_seconds
            self._staged.update((session_id, session.snapshot()) for session_id, session in self._changed.items())
            self._changed.clear()
            self._staged_checkpoint = True
        self._staged.update(self._evict())

    async def _send_outputs(self, partition: TopicPartition, items: list[Any]) -> None:
        """Send a partition's findings and dead letters in its transaction;
        a failed send fails the batch (nothing is committed)."""
        with self._fencing(partition):
            producer = await self._transaction(partition)
            deliveries = []
            for item in items:
                if isinstance(item, Finding):
                    deliveries.append(await producer.send(self.topics.findings, key=item.session.encode(),
                                                          value=item.to_json()))
                else:
                    deliveries.append(await self.send_dead_letter(producer, *item))
            await _all(deliveries)

    async def _commit_partition(self, partition: TopicPartition, offset: int) -> None:
        with self._fencing(partition):
            producer = await self._transaction(partition)
            await producer.send_offsets_to_transaction({partition: offset}, self.settings.group_id)
            await producer.commit_transaction()
        self._open.discard(partition)

    @contextlib.contextmanager
    def _fencing(self, partition: TopicPartition) -> Iterator[None]:
        try:
            yield
        except ProducerFenced as error:
            raise FencedError(f"{partition.topic}[{partition.partition}]: transactional id "
                              f"{self.transactional_id(partition)!r} was taken over by a newer member; this member "
                              "was replaced in the group and stops (its open transaction is aborted)") from error

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        await _all(self._commit_partition(partition, offset) for partition, offset in offsets.items())
        self._committed.update(offsets)
        staged, self._staged = self._staged, {}
        partitions = set(self._committed) if self._staged_checkpoint else set()
        self._staged_checkpoint = False
        if staged or partitions:
            self.store.write(staged, {tp.partition: self._committed[tp] for tp in partitions})
        if time.monotonic() >= self._pending_gauge_due:  # a sum over every session in memory: once a second
            self._pending_gauge_due = time.monotonic() + 1.0
            PENDING.set(sum(len(s.pending) for s in self._hot.values()))

    # ---------------------------------------------------------- state store

    def _evict(self) -> dict[str, _Saved]:
        """Take the least recently used sessions beyond the bound out of
        memory; returns the snapshots of those changed since stored."""
        evicted = {}
        while len(self._hot) > self.hot_sessions:
            session_id, session = self._hot.popitem(last=False)
            if self._changed.pop(session_id, None) is not None:
                evicted[session_id] = session.snapshot()
        AUDIT_SESSIONS.set(len(self._hot))
        return evicted

    def _store_now(self, partitions: set[TopicPartition]) -> None:
        """Store the changed sessions of the given partitions whose state in
        memory is exactly their committed state, with those offsets."""
        clean = {tp for tp in partitions if tp in self._committed
                 and self._consumed.get(tp, self._committed[tp]) == self._committed[tp]}
        numbers = {tp.partition for tp in clean}
        sessions = {session_id: session.snapshot() for session_id, session in self._changed.items()
                    if session.partition in numbers}
        for session_id in sessions:
            del self._changed[session_id]
        self.store.write(sessions, {tp.partition: self._committed[tp] for tp in clean})

    # ------------------------------------------------------------- rebuild

    async def on_assign(self, partitions: set[TopicPartition]) -> None:
        """Rebuild the assigned partitions' state: replay each from its
        stored offset (0 without one) to the committed offset, findings
        muted (they were emitted before)."""
        # Fence the previous owners before reading what they committed.
        await self._start_producers(partitions)
        replay = make_consumer(self.kafka, ConsumerSettings(group_id=None))
        await replay.start()
        self._muted = True
        try:
            for partition in partitions:
                committed = await self.consumer.committed(partition)
                if committed is None:
                    continue
                self._committed[partition] = committed
                stored = self.store.stored_offset(partition.partition)
                if stored is not None and stored > committed:  # the group's offsets were moved back
                    self.store.forget(partition.partition)
                    stored = None
                start = stored or 0
                if start >= committed:
                    continue
                replay.assign([partition])
                replay.seek(partition, start)
                done = False
                while not done:
                    batch = await replay.getmany(partition, timeout_ms=1000, max_records=5000)
                    for record in batch.get(partition, ()):
                        if record.offset >= committed:
                            done = True
                            break
                        await self._replay_one(record)
                    if not batch:
                        done = await replay.position(partition) >= committed
                    self.store.write(self._evict(), {})  # replayed state is committed state
        finally:
            self._muted = False
            await replay.stop()

    async def _replay_one(self, record: KafkaRecord) -> None:
        self.replayed += 1
        REPLAYED.inc()
        try:
            await self.handle(record, decode_kafka_record(record))
        except DshError:
            pass  # already dead-lettered when it was first consumed

    async def on_revoke(self, partitions: set[TopicPartition]) -> None:
        self._store_now(partitions)
        gone = {p.partition for p in partitions}
        for session_id in [s for s, state in self._hot.items() if state.partition in gone]:
            del self._hot[session_id]
            self._changed.pop(session_id, None)
        for partition in partitions:
            self._committed.pop(partition, None)
        AUDIT_SESSIONS.set(len(self._hot))
        await self._stop_producers(partitions)

    # -------------------------------------------------------------- records

    def _session(self, decoded: SessionRecord, record: KafkaRecord) -> _Session:
        session_id = decoded.session_id
        session = self._hot.get(session_id)
        if session is not None:
            self._hot.move_to_end(session_id)
        else:
            saved = self._staged.get(session_id) or self.store.load(session_id)
            session = (_Session.restore(session_id, saved, self) if saved is not None
                       else _Session(session_id, record.partition, self))
            self._hot[session_id] = session
        self._changed[session_id] = session
        return session

    async def on_error(self, error: DshError, record: KafkaRecord) -> None:
        if isinstance(error, DecodeError) and record.key:
            session = record.key.decode("utf-8", "replace")
            self.emit(Finding("corrupt-storage", session, None, f"{error.message} at {record.topic}"
                              f"[{record.partition}]@{record.offset}"), record.partition)
        await self.dead_letter(record, error)

    async def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        session = self._session(decoded, record)
        if session.refused:
            return
        if decoded.kind == KIND_HEADER:
            if session.fold is None:
                fold = StagedFold(f"session {decoded.session_id!r}", _BoundaryAudit(session))
                try:
                    fold.header_line(decoded.value)
                except DshError as error:
                    self._refuse(session, error, 0)
                    return
                session.fold = fold
                self._drain(session)
            return
        if decoded.kind == KIND_ATTESTATION:
            self._attestation(session, decoded)
            return
        problem = lossless_problem(decoded.value)
        if problem:
            session.emit("lossless", decoded.seq, problem)
        expected = session.fold.count if session.fold is not None else 0
        if decoded.seq < expected:
            return  # a duplicate: transport, not a log defect
        if decoded.seq > expected or session.fold is None:
            if session.gap_reported != expected:
                session.gap_reported = expected
                missing = (f"records from seq {expected} to {decoded.seq - 1} are" if session.fold is not None
                           else "the session header is")
                session.emit("sequence-gap", expected, f"{missing} missing (got seq {decoded.seq} at "
                             f"{record.topic}[{record.partition}]@{record.offset})")
            if decoded.seq not in session.held:
                if len(session.held) >= HELD_LIMIT:
                    raise held_limit_error(decoded.session_id, expected, decoded.seq)
                session.held[decoded.seq] = decoded.value
            return
        self._apply(session, decoded.value, decoded.seq)
        self._drain(session)

    def _apply(self, session: _Session, value: bytes, seq: int) -> None:
        fold = session.fold
        before = fold.count
        try:
            fold.apply(value)
        except DecodeError as error:
            self._refuse(session, error, seq)
            return
        if fold.error is not None:
            self._refuse(session, fold.error, seq)
            return
        if not self._muted:
            self.count(AUDITED, fold.count - before)
        self._verify_pending(session)

    def _drain(self, session: _Session) -> None:
        while session.held and session.fold is not None and not session.refused:
            expected = session.fold.count
            for seq in [s for s in session.held if s < expected]:
                del session.held[seq]
            value = session.held.pop(expected, None)
            if value is None:
                return
            self._apply(session, value, expected)
        if not session.held:
            session.gap_reported = None

    def _refuse(self, session: _Session, error: DshError, seq: int) -> None:
        session.refused = True
        session.emit(error.category, seq, f"{type(error).__name__}: {error.message}")

    # -------------------------------------------------------- attestations

    def _verdict(self, verdict: str) -> None:
        if not self._muted:  # a replay re-checks what was counted before
            REQUESTS.labels(verdict).inc()

    def _attestation(self, session: _Session, decoded: SessionRecord) -> None:
        boundary = decoded.seq
        position = session.fold.count if session.fold is not None else 0
        if position > boundary:
            self._verdict("late")
            session.emit("attestation-late", boundary, f"attestation for boundary {boundary} arrived after seq "
                         f"{position - 1}; its prefix is gone")
            return
        session.pending[boundary] = decoded.value
        self._verify_pending(session)

    def _verify_pending(self, session: _Session) -> None:
        if not session.pending or session.fold is None:
            return
        boundary = session.fold.count
        attestation = session.pending.pop(boundary, None)
        if attestation is None:
            return
        body = decode_json(attestation)
        state = session.fold.state
        session.attested.add(boundary)
        if state.header is None:
            self._verdict("no-header")
            session.emit("no-request-header", boundary, "an attested request with no request/header in force",
                         body.get("turn"), body.get("step"))
            return
        if state.header is not session.frame_header:
            session.frame_header, session.frame = state.header, request_frame(state.header, session.session_id)
        generation = state.surface.replace_generation
        rebuilt = session.request_digest.of(state.current_messages(), generation, *session.frame)
        if rebuilt == body.get("digest"):
            self._verdict("verified")
            return
        self._verdict("mismatch")
        session.emit("request-mismatch", boundary,
                     f"the request sent (digest {body.get('digest')}) is not the one the log rebuilds ({rebuilt}): "
                     "model-visible content outside the log", body.get("turn"), body.get("step"))
