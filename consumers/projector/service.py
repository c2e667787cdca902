"""The projector: every session's derived, model-visible conversation.

Per session it runs the fold of the session's format (dsh_core.formats.registry: v0's
staged fold, v4's, v3 migrated to v4 as dsh does), ordered by the runtime's
sequencing: duplicates (the bytes applied before at their seq) are counted
and skipped, other bytes at an applied seq are a conflicting writer's and
dead-lettered, and so is every record of another writer than the session's
header's (``dsh-writer``): the session is then ``conflicted`` (its first
writer's records are still applied). A record above the next seq holds the
session (status ``held``; its later records are kept) until the missing one
arrives and the session heals. A record the fold refuses marks the session refused and
is dead-lettered with its category.

One store transaction per batch writes every changed session (view, fold
snapshot, surface rows, held records, applied digests) before the offsets
are committed, so views are exactly-once. Each assignment claims its
partitions in the store (their owner epochs go up), and a batch is written
only while this member's epochs are current: a member the group replaced
while it stalled stops with :class:`FencedError` instead of writing over
its successor's views. A cold session, or one whose partition was revoked
and came back, is restored from its snapshot. View heads go to the
compacted ``dsh.session-views`` topic; the same transaction notes each
session whose head is not acknowledged yet, and the note goes once the
batch is committed. A member assigned a partition first publishes the
heads still noted for its sessions, so a crash between the view commit and
the heads' acknowledgement loses no head.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from aiokafka import TopicPartition
from prometheus_client import Counter, Gauge

from dsh_core.analysis import LogAnalysis
from dsh_core.event_time import line_time
from dsh_core.errors import ConflictingWriterError, DeletedSessionError, DshError, InternalError, UnstorableError
from dsh_core.formats import SessionFold, open_fold, opened_header
from dsh_core.fold_snapshot import restore_fold, snapshot_fold
from dsh_core.request import MessagesDigest
from dsh_kafka.records import (KIND_DELETION, KIND_HEADER, KIND_RECORD, KafkaRecord, SessionRecord, check_format,
                               check_identity, check_same_header, check_writer, where_of)

from ..runtime.config import ServiceConfig
from ..runtime.metrics import LabelValues
from ..runtime.outputs import ProducerOutputs
from ..runtime.policy import CommittedOffset, Policy
from ..runtime.sequencing import AppliedDigest, AppliedDigests, HeldRecords, Placement, check_copy, deliver, drain
from ..runtime.service import ConsumerService
from .store import SessionChange, ViewStore, view_head
from .timings import StepClock

__all__ = ["Projection", "ProjectorConfig", "projector_service"]

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
COST = Counter("dsh_cost_usd_total", "What assistant messages' tokens cost by the price table (US dollars), by "
               "provider and model; a model without a price adds nothing.", ["provider", "model"])

_log = logging.getLogger("dsh.projector")

# Label values come from log content: bounded, so /metrics stays small.
_reasons, _models = LabelValues(32), LabelValues(256)
# Label lookups cost more than the increments (one per assistant message).
_turn_ends = functools.lru_cache(maxsize=256)(TURN_ENDS.labels)
_tokens = functools.lru_cache(maxsize=4096)(TOKENS.labels)
_cost = functools.lru_cache(maxsize=1024)(COST.labels)
#: What a usage row costs: ``(provider, model, token counts)`` to US dollars, ``None`` without a price.
PriceFunction = Callable[[str, str, Mapping[str, Any]], float | None]


def _count_turn_end(reason: Any) -> None:
    _turn_ends(_reasons(str(reason.get("kind")) if isinstance(reason, dict) else "unknown")).inc()


def _count_usage(provider: str, model: str, counted: dict[str, int]) -> None:
    provider, model = _models(provider), _models(model)
    for kind, value in counted.items():
        if value > 0:  # a negative count is the log's to keep, not a counter's
            _tokens(provider, model, kind).inc(value)


def _analysis(counted: list[tuple[str, str, dict[str, int]]] | None = None) -> LogAnalysis:
    """The projector's analysis; the usage it counts is also added to
    ``counted``, when given."""
    def on_usage(provider: str, model: str, counts: dict[str, int]) -> None:
        _count_usage(provider, model, counts)
        if counted is not None:
            counted.append((provider, model, counts))

    return LogAnalysis(keep_requests=False, on_turn_end=_count_turn_end, on_usage=on_usage, count_requests=False)


@dataclass(frozen=True, kw_only=True)
class ProjectorConfig(ServiceConfig):
    store: Path | str  # the view store: a SQLite file, or a postgresql:// URI
    group: str = "dsh-projector"
    price: PriceFunction | None = None  # counts dsh_cost_usd_total (none: no cost counted)


@dataclass
class ProjectedSession:
    """One session's fold, analysis and status (``open``, ``held``, ``refused``);
    ``conflicted`` once a second writer showed (its view's status says so
    unless the session is refused)."""

    session_id: str
    partition: int
    held: HeldRecords
    digests: AppliedDigests
    fold: SessionFold | None = None
    analysis: LogAnalysis = field(init=False)  # its usage callback adds to counted (__post_init__)
    status: str = "open"
    conflicted: bool = False
    error: str | None = None
    digest: MessagesDigest = field(default_factory=MessagesDigest)
    stored_surface: set[int] = field(default_factory=set)  # seqs with a row in the surface table
    applied: int = 0  # events folded since the policy last counted them
    last_activity: int | None = None  # ms: the newest event time of the records this process applied
    ingested_at: int | None = None  # ms: the newest topic timestamp of the records this process applied
    stored_usage: list[dict[str, Any]] | None = None  # the usage the store holds (None: not known)
    clock: StepClock = field(default_factory=StepClock)
    surface_times: dict[int, int] = field(default_factory=dict)  # event times of the seqs applied since change()
    counted: list[tuple[str, str, dict[str, int]]] = field(default_factory=list)  # usage of the line being applied
    price: PriceFunction | None = None

    def __post_init__(self) -> None:
        self.analysis = _analysis(self.counted)

    def next_seq(self) -> int | None:
        return self.fold.count if self.fold is not None else None

    def held_bytes(self) -> int:
        return self.held.bytes

    def apply(self, value: bytes, count: int) -> bool:
        fold = self.fold
        assert fold is not None, "records are applied after the header"  # next_seq() is None before
        before = fold.count
        self.counted.clear()
        fold.apply(value)  # a DecodeError refuses the record, not the session
        if fold.error is not None:
            self.refuse(fold.error)
            raise fold.error
        self.applied += fold.count - before
        self.timed(value, fold.count - 1)
        return True

    def timed(self, line: bytes, seq: int) -> None:
        """Note the event times of a line applied (its last event at ``seq``)."""
        times = line_time(line)
        if times is None:
            return
        self.last_activity = max(self.last_activity or times.last, times.last)
        if times.type != "session":
            self.surface_times[seq] = times.last
            self.clock.observe(times, self.counted)
        if self.price is not None:
            for provider, model, counts in self.counted:
                cost = self.price(provider, model, counts)
                if cost:
                    _cost(_models(provider), _models(model)).inc(cost)

    def unstorable(self, error: UnstorableError) -> SessionChange:
        """The rows of a session the store refused rows of: refused, with
        neither fold nor analysis (what the store refused is in them)."""
        self.refuse(error)
        self.fold, self.analysis = None, _analysis(self.counted)
        return self.change()

    def refuse(self, error: DshError) -> None:
        self.status = "refused"
        text = f"[{error.category}] {type(error).__name__}: {error.message}"
        self.error = text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate stays readable
        REFUSED.labels(error.category).inc()

    def view(self) -> dict[str, Any]:
        fold, analysis = self.fold, self.analysis
        turns = analysis.turns
        next_seq = fold.count if fold is not None else 0
        view: dict[str, Any] = {"sessionId": self.session_id, "status": self.status,
                                "header": fold.header.to_dict() if fold is not None and fold.header else None,
                                "nextSeq": next_seq, "turns": turns,
                                "lastTurnEnd": turns[-1]["reason"] if turns else None,
                                "usage": [{"provider": p, "model": m, **dict(t)} for (p, m), t in analysis.usage.items()]}
        if fold is not None:
            state = fold.state
            surface = state.surface
            messages = state.current_messages()
            view |= {"surfaceLength": len(surface.nodes), "replaceGeneration": surface.replace_generation,
                     "messageCount": len(messages),
                     "messagesDigest": self.digest.of(messages, surface.replace_generation),
                     "requestHeader": state.header, "requestContext": state.context,
                     "requestHeaderChanges": analysis.header_changes}
        if self.status == "held":
            view["heldFrom"] = next_seq
            view["heldRecords"] = len(self.held)
        if self.error:
            view["error"] = self.error
        if fold is not None and fold.idle and self.status == "open":
            view["status"] = "idle"
        if self.conflicted:
            view["conflicted"] = True
            if self.status != "refused":
                view["status"] = "conflicted"
        return view

    def change(self) -> SessionChange:
        """The rows to store for this session now."""
        current = self.fold.state.surface_events() if self.fold is not None else {}
        gone = self.stored_surface - current.keys()  # surface rows change by difference
        new = [(seq, *current[seq]) for seq in current.keys() - self.stored_surface]
        self.stored_surface = set(current)
        held = self.held.changes() if self.held.dirty else None
        snapshot = snapshot_fold(self.fold, with_surface_events=False) if self.fold is not None else None
        view = self.view()
        usage_changed = view["usage"] != self.stored_usage
        self.stored_usage = view["usage"]
        times, self.surface_times = self.surface_times, {}
        return SessionChange(self.session_id, self.partition, view, snapshot, self.error, gone, new, held,
                             self.digests.changes(), self.last_activity, usage_changed, self.ingested_at,
                             self.clock.changed(), {seq: times[seq] for seq, _, _ in new if seq in times})


class Projection(Policy[ProjectedSession, ViewStore]):
    name = "projector"
    config: ProjectorConfig

    def __init__(self, config: ProjectorConfig) -> None:
        super().__init__(config)
        self._changed: dict[str, ProjectedSession] = {}
        self._handled: dict[str, list[KafkaRecord]] = {}  # the batch's records each session took, until persisted
        self._unacknowledged: list[str] = []  # sessions whose heads the commit in flight covers
        self._unstored: set[str] = set()  # the batch's sessions the store has no row of (prepare)
        self._epochs: dict[int, int] = {}  # the owner epoch of each assigned partition (ViewStore.claim)
        self._deleted: set[str] = set()  # the batch's sessions that were deleted (prepare, and its deletions)
        self._deletions: dict[str, tuple[int, int]] = {}  # deleted by this batch: partition, when (ms)

    def open_store(self) -> ViewStore:
        return ViewStore(self.config.store)

    def prepare(self, session_ids: set[str]) -> None:
        """Ask the store once which of the batch's cold sessions it has never
        stored: those start empty without a lookup each (catching up, most
        of a batch's sessions are new; on PostgreSQL each lookup is a round
        trip)."""
        cold = [session_id for session_id in session_ids if self.sessions.get(session_id) is None]
        self._unstored = set(cold) - self.store.stored(cold) if cold else set()
        self._deleted = self.store.deleted(list(session_ids))
        for session_id in self._deleted:  # deleted (delete-session) while this member held it
            self._forget(session_id)

    def _session(self, session_id: str, partition: int) -> ProjectedSession:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        saved = None if session_id in self._unstored else self.store.load(session_id)
        self._unstored.discard(session_id)
        held = saved[3] if saved is not None else ()
        session = ProjectedSession(session_id, partition, HeldRecords(session_id, held),
                                   AppliedDigests(session_id, functools.partial(self._stored_digest, session_id)),
                                   price=self.config.price)
        if saved is not None:
            session.status, blob, session.error = saved[0], saved[1], saved[2]
            if session.status == "conflicted":  # the view's status: the session's own is held or open
                session.conflicted, session.status = True, "held" if held else "open"
            if blob is not None:
                rows = self.store.surface_events(session_id)
                session.fold = restore_fold(blob, f"session {session_id!r}", session.analysis, rows)
                session.stored_surface = {seq for seq, _, _ in rows}
                session.clock.resume(self.store.steps(session_id))
        self.sessions.put(session_id, session)
        return session

    def _stored_digest(self, session_id: str, seq: int) -> AppliedDigest | None:
        return self.store.digest(session_id, seq)

    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        if decoded.kind == KIND_DELETION:
            self._forget(decoded.session_id)
            self._deleted.add(decoded.session_id)
            self._deletions[decoded.session_id] = (record.partition, record.timestamp)
            return
        if decoded.session_id in self._deleted and decoded.kind in (KIND_HEADER, KIND_RECORD):
            raise DeletedSessionError(decoded.session_id, decoded.seq, where_of(record))
        if decoded.kind not in (KIND_HEADER, KIND_RECORD):
            SKIPPED.labels("attestation").inc()
            return
        session = self._session(decoded.session_id, record.partition)
        try:
            check_writer(decoded, session.fold.header if session.fold is not None else None)
            if session.status == "refused":
                if decoded.kind == KIND_RECORD:
                    self._copy_of_refused(session, decoded)
                SKIPPED.labels("session-refused").inc()
                return
            if decoded.kind == KIND_HEADER:
                self._header(session, decoded)
            else:
                self._record(session, decoded)
            self._handled.setdefault(session.session_id, []).append(record)
            if session.applied or decoded.kind == KIND_HEADER:
                session.ingested_at = max(session.ingested_at or 0, record.timestamp)
        except ConflictingWriterError:
            session.conflicted = True
            self._changed[session.session_id] = session
            raise
        finally:
            if session.applied:
                self.tally.add(APPLIED, session.applied)
                session.applied = 0

    def _forget(self, session_id: str) -> None:
        """Hold nothing of a deleted session (its store rows go with the batch)."""
        self.sessions.forget(session_id)
        self._changed.pop(session_id, None)

    def refuse(self, error: DshError, record: KafkaRecord) -> bool:
        session = self.sessions.get(record.key.decode("utf-8", "replace")) if record.key else None
        if isinstance(error, InternalError) and session is not None:  # its state is not trusted any more
            session.refuse(error)
            self._changed[session.session_id] = session
        return super().refuse(error, record)

    def _copy_of_refused(self, session: ProjectedSession, decoded: SessionRecord) -> None:
        """A refused session's record at an applied seq in other bytes is a
        second writer's: its refusal was that writer's doing, and says so."""
        try:
            check_copy(session, decoded.seq, decoded.value, decoded.count)
        except ConflictingWriterError as error:
            session.refuse(error)
            self._changed[session.session_id] = session
            raise

    def _header(self, session: ProjectedSession, decoded: SessionRecord) -> None:
        if session.fold is not None:
            check_same_header(decoded, opened_header(session.fold))
            self.tally.add(DUPLICATES)
            return
        self._changed[session.session_id] = session
        try:
            fold = open_fold(decoded.value, f"session {decoded.session_id!r}", session.analysis)
        except DshError as error:
            session.refuse(error)
            raise
        check_identity(decoded, opened_header(fold))
        session.fold = fold
        session.timed(decoded.value, -1)
        drain(session)
        self._heal(session)

    def _record(self, session: ProjectedSession, decoded: SessionRecord) -> None:
        check_format(decoded, session.fold.header if session.fold is not None else None)
        try:
            placement = deliver(session, decoded.seq, decoded.value, decoded.count)
        except DshError:
            self._changed[session.session_id] = session  # a refusal changed its status
            raise
        if placement is Placement.DUPLICATE:
            self.tally.add(DUPLICATES)
            return
        self._changed[session.session_id] = session
        if placement is Placement.APPLIED:
            self._heal(session)
            return
        if placement is Placement.HELD:
            self.tally.add(GAPS)
        session.status = "held"

    @staticmethod
    def _heal(session: ProjectedSession) -> None:
        if session.status == "held" and not session.held:
            session.status = "open"

    def persist(self) -> None:
        handled, self._handled = self._handled, {}
        if not self._changed and not self._deletions:
            return
        changes = [session.change() for session in self._changed.values()]
        try:
            gone = self.store.write(changes, self._epochs, self._deletions)
        except UnstorableError:  # one session's rows: each is written alone, and those refused refuse their session
            gone = self.store.write([], self._epochs, self._deletions)
            written = (self._write_alone(change, handled.get(change.session_id, [])) for change in changes)
            changes = [change for change in written if change is not None]
        changes = [change for change in changes if change.session_id not in gone]
        self._changed.clear()
        for change in changes:
            self.outputs.send(change.partition, self.config.topics.views, change.session_id.encode(),
                              view_head(change.view))
        for session_id, (partition, _) in self._deletions.items():  # the compacted topic forgets it too
            self.outputs.send(partition, self.config.topics.views, session_id.encode(), None)
        self._deletions = {}
        self._unacknowledged = [change.session_id for change in changes]
        self.sessions.evict()  # nothing unwritten is left to lose
        SESSIONS.labels("hot").set(len(self.sessions))
        SESSIONS.labels("held").set(sum(1 for s in self.sessions if s.status == "held"))

    def _write_alone(self, change: SessionChange, records: list[KafkaRecord]) -> SessionChange | None:
        """Write one session's rows; rows the store refuses refuse the
        session, and the batch's ``records`` that made them are
        dead-lettered. What was written, or ``None`` for a session deleted
        meanwhile (nothing written)."""
        try:
            return None if self.store.write([change], self._epochs) else change
        except UnstorableError as error:
            _log.warning("dead-lettered %d record(s), reason %s; %s", len(records), error.category, error.message)
            for record in records:
                self.outputs.dead_letter(record, error)
            refused = self._changed[change.session_id].unstorable(error)
            return None if self.store.write([refused], self._epochs) else refused

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        self.store.acknowledged(self._unacknowledged)
        self._unacknowledged = []

    async def assigned(self, partitions: set[TopicPartition], committed: CommittedOffset) -> None:
        """Publish the heads a crash left unacknowledged for these partitions'
        sessions (their views are committed; their records come back only
        as duplicates)."""
        self._epochs.update(self.store.claim(tp.partition for tp in partitions))
        heads = self.store.unacknowledged(tp.partition for tp in partitions)
        if not heads:
            return
        for session_id, partition, head in heads:
            self.outputs.send(partition, self.config.topics.views, session_id.encode(), head)
        await self.outputs.publish()
        await self.outputs.flush()
        self.store.acknowledged([session_id for session_id, _, _ in heads])
        REPUBLISHED.inc(len(heads))

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        await super().revoked(partitions)
        for tp in partitions:
            self._epochs.pop(tp.partition, None)
        SESSIONS.labels("hot").set(len(self.sessions))


def projector_service(config: ProjectorConfig) -> ConsumerService:
    outputs = ProducerOutputs(config.kafka, config.topics, Projection.name, config.redrive_key)
    return ConsumerService(config, Projection(config), outputs)
