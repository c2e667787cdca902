"""Per-session record order, shared by every consumer service.

``seq`` is the idempotency key (docs/concepts/delivery.md): a record below the
session's next seq is a duplicate; one above it, or any record before the
session can take records at all (no header yet), is held until the gap
below it fills; the next one is applied, and so are the held records it
makes contiguous. A duplicate is proven by its content: a record at a seq
applied or held before, carrying as many events in other bytes, is refused
with :class:`ConflictingWriterError` (two writers of one session). At most ``limit`` records and ``byte_limit`` bytes are
held per session: one more is refused with :class:`HeldLimitError` (its
service dead-letters it; re-shipping the session brings it back once the
gap is filled).
"""

from __future__ import annotations

import enum
import hashlib
from typing import Callable, Iterable, Protocol

from dsh_core.errors import ConflictingWriterError, HeldLimitError

__all__ = ["AppliedDigest", "AppliedDigests", "WRITER_SEQ", "HELD_BYTES", "HELD_LIMIT", "HELD_MEMORY_BYTES",
           "HeldChanges", "HeldRecords", "HeldRow", "Placement", "Sequenced", "check_copy", "deliver", "drain"]

#: Records a service keeps per session while it waits for a missing seq ...
HELD_LIMIT = 10_000
#: ... and the bytes of their values, at most.
HELD_BYTES = 64 * 1024 * 1024
#: Bytes a service keeps in memory for later over all its sessions (held
#: records, pending attestations); beyond them the sessions holding any
#: leave memory (their store keeps what they held).
HELD_MEMORY_BYTES = 2 * HELD_BYTES


class Placement(enum.Enum):
    """What :func:`deliver` did with a record."""

    DUPLICATE = "duplicate"  # below the next seq: already applied
    HELD = "held"  # above the next seq (or before the header): kept
    HELD_AGAIN = "held-again"  # a copy of a record already held
    APPLIED = "applied"  # the next record: applied, with what it made contiguous


#: ``(seq, value, count)`` of a held record, as a store keeps it.
HeldRow = tuple[int, bytes, int]
#: The seqs gone and the rows added since a store last wrote a session's held records.
HeldChanges = tuple[list[int], list[HeldRow]]


class HeldRecords:
    """The records of one session waiting for a missing seq: ``seq ->
    (value, count)``, bounded by ``limit`` records and ``byte_limit`` bytes.
    It notes what changed since a store last wrote it, so a store writes
    the change, not every held record again."""

    __slots__ = ("session_id", "records", "limit", "byte_limit", "bytes", "_added", "_removed")

    def __init__(self, session_id: str, records: Iterable[HeldRow] = (), limit: int = HELD_LIMIT,
                 byte_limit: int = HELD_BYTES) -> None:
        self.session_id = session_id
        self.records = {seq: (value, count) for seq, value, count in records}
        self.limit = limit
        self.byte_limit = byte_limit
        self.bytes = sum(len(value) for value, _ in self.records.values())
        self._added: set[int] = set()
        self._removed: set[int] = set()

    def __len__(self) -> int:
        return len(self.records)

    @property
    def dirty(self) -> bool:
        """Whether it changed since :meth:`changes` was last taken."""
        return bool(self._added or self._removed)

    def rows(self) -> list[HeldRow]:
        """Every held record in seq order."""
        return [(seq, value, count) for seq, (value, count) in sorted(self.records.items())]

    def changes(self) -> HeldChanges:
        """The seqs gone and the records added since the last call, for a
        store to write; it is clean afterwards."""
        removed = sorted(self._removed)
        added = [(seq, *self.records[seq]) for seq in sorted(self._added)]
        self._added, self._removed = set(), set()
        return removed, added

    def hold(self, seq: int, value: bytes, count: int, waiting_for: int) -> bool:
        """Keep a record; returns whether it is new. Raises
        :class:`HeldLimitError` when the session holds ``limit`` records or
        the value would take it past ``byte_limit`` bytes."""
        if seq in self.records:
            first, first_count = self.records[seq]
            if first_count == count and first != value:
                raise ConflictingWriterError(self.session_id, seq, _other_bytes(_sha256(first), _sha256(value)))
            return False
        if len(self.records) >= self.limit or self.bytes + len(value) > self.byte_limit:
            raise HeldLimitError(self.session_id, waiting_for, seq, self.limit, self.byte_limit)
        self.records[seq] = (value, count)
        self.bytes += len(value)
        self._added.add(seq)
        return True

    def take(self, next_seq: int) -> tuple[bytes, int] | None:
        """The held record at ``next_seq``, if any, dropping those below it
        (copies of records applied since)."""
        stale = [seq for seq in self.records if seq < next_seq]
        for seq in stale:
            self._forget(seq)
        return self._forget(next_seq) if next_seq in self.records else None

    def _forget(self, seq: int) -> tuple[bytes, int]:
        item = self.records.pop(seq)
        self.bytes -= len(item[0])
        if seq in self._added:
            self._added.discard(seq)  # never stored
        else:
            self._removed.add(seq)
        return item


def _sha256(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def _other_bytes(first: bytes, then: bytes) -> str:
    return f"a record of sha256 {then.hex()}, where one of sha256 {first.hex()} came first"


#: ``(count, sha256)`` of the record a session applied at a seq.
AppliedDigest = tuple[int, bytes]
#: Where a session's digests note the writer its records named first:
#: ``(0, that dsh-writer)``, empty for a header record that named none
#: (:mod:`.writers`).
WRITER_SEQ = -1


class AppliedDigests:
    """The events count and sha256 of every record a session applied, by its
    first seq. New ones wait in :attr:`new` for a store to write them
    (:meth:`changes`); older ones are asked of ``stored``, which answers
    ``None`` where it keeps none (a service's crash between its output and
    its store): such a copy counts as a duplicate, unproven. So does a copy
    framed otherwise (another count from the same seq: a live writer sends
    stream deltas one by one where the session file packs them). The
    writer the session's records named first is noted with them, under
    :data:`WRITER_SEQ` (:meth:`note_writer`)."""

    __slots__ = ("session_id", "stored", "new", "_writer", "_asked")

    def __init__(self, session_id: str, stored: Callable[[int], AppliedDigest | None] = lambda seq: None,
                 unstored: bool = False) -> None:
        """``unstored``: ``stored`` holds nothing of the session yet (it is
        not asked for its writer)."""
        self.session_id = session_id
        self.stored = stored
        self.new: dict[int, AppliedDigest] = {}
        self._writer: str | None = None
        self._asked = unstored  # whether ``stored`` was asked for the writer (once is enough)

    def note_writer(self, writer: str) -> None:
        """Note the ``dsh-writer`` the session's records named first
        (``""``: its header record named none)."""
        self._writer, self._asked = writer, True
        self.new[WRITER_SEQ] = (0, writer.encode())

    def writer(self) -> str | None:
        """The ``dsh-writer`` the session's records named first (``""``:
        its header record named none); ``None`` where none was noted (no
        record named one yet, or the session took its header before
        writers were noted)."""
        if not self._asked:
            self._asked = True
            noted = self.stored(WRITER_SEQ)
            if noted is not None:
                self._writer = bytes(noted[1]).decode("utf-8", "replace")
        return self._writer

    @property
    def dirty(self) -> bool:
        return bool(self.new)

    def add(self, seq: int, value: bytes, count: int) -> None:
        self.new[seq] = (count, _sha256(value))

    def check(self, seq: int, value: bytes, count: int) -> None:
        """Raise :class:`ConflictingWriterError` if the record applied at
        ``seq`` carried as many events in other bytes than ``value``."""
        first = self.new.get(seq) or self.stored(seq)
        if first is not None and first[0] == count:
            then = _sha256(value)
            if then != first[1]:
                raise ConflictingWriterError(self.session_id, seq, _other_bytes(first[1], then))

    def changes(self) -> dict[int, AppliedDigest]:
        """What was added since the last call, by seq, for a store to write."""
        new, self.new = self.new, {}
        return new


class Sequenced(Protocol):
    """A session whose records :func:`deliver` orders."""

    held: HeldRecords
    digests: AppliedDigests

    def next_seq(self) -> int | None:
        """The seq the session takes next; ``None`` while it takes none yet."""

    def apply(self, value: bytes, count: int) -> bool:
        """Apply the record at :meth:`next_seq`; ``False`` once the session
        takes no more (it was refused). May raise to refuse the record."""


def check_copy(session: Sequenced, seq: int, value: bytes, count: int) -> bool:
    """Whether the record is a copy of one the session applied (below its
    next seq); raises :class:`ConflictingWriterError` where it carries as
    many events in other bytes. A session whose log was refused still asks
    this of its records: the refusal may have been a second writer's events,
    folded at the next seqs before its own copies of them showed it."""
    expected = session.next_seq()
    if expected is None or seq >= expected:
        return False
    session.digests.check(seq, value, count)
    return True


def deliver(session: Sequenced, seq: int, value: bytes, count: int) -> Placement:
    """Place one record of ``session`` carrying events from ``seq`` on."""
    if check_copy(session, seq, value, count):
        return Placement.DUPLICATE
    expected = session.next_seq()
    if expected is None or seq > expected:
        return Placement.HELD if session.held.hold(seq, value, count, expected or 0) else Placement.HELD_AGAIN
    if _apply(session, seq, value, count):
        drain(session)
    return Placement.APPLIED


def _apply(session: Sequenced, seq: int, value: bytes, count: int) -> bool:
    """Apply the record at the next seq, noting its digest once it is the
    session's (folded, even where that refused the log)."""
    try:
        return session.apply(value, count)
    finally:
        if (session.next_seq() or 0) > seq:
            session.digests.add(seq, value, count)


def drain(session: Sequenced) -> int:
    """Apply the held records that now continue the session; returns how many."""
    applied = 0
    while session.held.records:
        expected = session.next_seq()
        item = session.held.take(expected) if expected is not None else None
        if expected is None or item is None:
            break
        applied += 1
        if not _apply(session, expected, *item):
            break
    return applied
