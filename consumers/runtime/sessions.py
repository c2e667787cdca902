"""The sessions a consumer service keeps in memory: an LRU bounded in
sessions and in the bytes of the records they hold at gaps, with an index
by partition, so a revoked partition's sessions go at once."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Iterator, Protocol, TypeVar

from .sequencing import HELD_MEMORY_BYTES, HeldRecords

__all__ = ["HotSession", "SessionTable"]


class HotSession(Protocol):
    partition: int
    held: HeldRecords


S = TypeVar("S", bound=HotSession)


class SessionTable(Generic[S]):
    """Hot sessions by id, least recently used first."""

    def __init__(self, capacity: int, held_bytes: int = HELD_MEMORY_BYTES) -> None:
        if capacity < 1:
            raise ValueError(f"a session table holds at least one session, not {capacity}")
        self.capacity = capacity
        self.held_bytes = held_bytes
        self._sessions: OrderedDict[str, S] = OrderedDict()
        self._by_partition: dict[int, set[str]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[S]:
        return iter(self._sessions.values())

    def get(self, session_id: str) -> S | None:
        """The session, now the most recently used; ``None`` if not hot."""
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
        return session

    def put(self, session_id: str, session: S) -> None:
        """Keep ``session`` (replacing one of the same id) as the most recent."""
        self._forget(session_id)
        self._sessions[session_id] = session
        self._by_partition.setdefault(session.partition, set()).add(session_id)

    def evict(self) -> list[tuple[str, S]]:
        """Take out the least recently used sessions beyond the capacity,
        then, while the records held in memory take more than
        ``held_bytes``, the least recently used of those holding records
        (a store keeps them: they come back with their session)."""
        evicted = []
        while len(self._sessions) > self.capacity:
            session_id = next(iter(self._sessions))
            evicted.append((session_id, self._forget(session_id)))
        held = sum(session.held.bytes for session in self._sessions.values())
        if held > self.held_bytes:
            for session_id in [key for key, session in self._sessions.items() if session.held.bytes]:
                session = self._forget(session_id)
                evicted.append((session_id, session))
                held -= session.held.bytes
                if held <= self.held_bytes:
                    break
        return evicted

    def drop_partitions(self, partitions: set[int]) -> list[tuple[str, S]]:
        """Take out every session of these partitions (they were revoked:
        another member continues them)."""
        dropped = []
        for partition in partitions:
            for session_id in self._by_partition.pop(partition, set()):
                dropped.append((session_id, self._sessions.pop(session_id)))
        return dropped

    def _forget(self, session_id: str) -> S | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            ids = self._by_partition.get(session.partition)
            if ids is not None:
                ids.discard(session_id)
                if not ids:
                    del self._by_partition[session.partition]
        return session
