"""The sessions a consumer service keeps in memory: an LRU bounded in
sessions and in the bytes they hold for later (records at gaps, pending
attestations), with an index by partition, so a revoked partition's
sessions go at once."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Iterator, Protocol, TypeVar

from .sequencing import HELD_MEMORY_BYTES

__all__ = ["HotSession", "SessionTable"]


class HotSession(Protocol):
    partition: int

    def held_bytes(self) -> int:
        """Bytes the session keeps for later (its store keeps them too)."""


S = TypeVar("S", bound=HotSession)


class SessionTable(Generic[S]):
    """Hot sessions by id, least recently used first."""

    def __init__(self, capacity: int, held_budget: int = HELD_MEMORY_BYTES) -> None:
        if capacity < 1:
            raise ValueError(f"a session table holds at least one session, not {capacity}")
        self.capacity = capacity
        self.held_budget = held_budget
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
        self.forget(session_id)
        self._sessions[session_id] = session
        self._by_partition.setdefault(session.partition, set()).add(session_id)

    def evict(self) -> list[tuple[str, S]]:
        """Take out the least recently used sessions beyond the capacity,
        then, while what the sessions hold for later takes more than
        ``held_budget`` bytes, the least recently used of those holding anything
        (a store keeps it: it comes back with its session)."""
        evicted: list[tuple[str, S]] = []
        while len(self._sessions) > self.capacity:
            session_id, session = next(iter(self._sessions.items()))
            self.forget(session_id)
            evicted.append((session_id, session))
        weights = {key: weight for key, session in self._sessions.items() if (weight := session.held_bytes())}
        held = sum(weights.values())
        for session_id, weight in weights.items():
            if held <= self.held_budget:
                break
            evicted.append((session_id, self._sessions[session_id]))
            self.forget(session_id)
            held -= weight
        return evicted

    def drop_partitions(self, partitions: set[int]) -> list[tuple[str, S]]:
        """Take out every session of these partitions (they were revoked:
        another member continues them)."""
        dropped = []
        for partition in partitions:
            for session_id in self._by_partition.pop(partition, set()):
                dropped.append((session_id, self._sessions.pop(session_id)))
        return dropped

    def forget(self, session_id: str) -> S | None:
        """Take the session out (it was deleted); ``None`` if it was not hot."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            ids = self._by_partition.get(session.partition)
            if ids is not None:
                ids.discard(session_id)
                if not ids:
                    del self._by_partition[session.partition]
        return session
