"""What a consumer service decides; the runtime (:mod:`.service`) does the rest.

A policy applies records to its sessions and makes their effects durable;
it never polls, commits or sends by itself. Its records leave through the
:class:`~.outputs.Outputs` it is opened with, at the runtime's checkpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Awaitable, Callable, Generic, Protocol, TypeVar

from aiokafka import TopicPartition

from dsh_core.errors import DshError, PipelineError
from dsh_kafka.records import KafkaRecord, SessionRecord

from .config import ServiceConfig
from .metrics import Tally
from .outputs import Outputs
from .sessions import HotSession, SessionTable

__all__ = ["CommittedOffset", "Policy", "Store", "StoreT"]

S = TypeVar("S", bound=HotSession)


class Store(Protocol):
    """A service's files: closed when the service stops."""

    def close(self) -> None: ...


StoreT = TypeVar("StoreT", bound=Store)


#: The group's committed offset of a partition, asked of the cluster.
CommittedOffset = Callable[[TopicPartition], Awaitable[int | None]]


class Policy(ABC, Generic[S, StoreT]):
    """A service's decisions over its hot sessions (an LRU of the
    configuration's ``hot_sessions``).

    The runtime calls, in this order for every batch: :meth:`prepare` with
    the sessions it names, :meth:`handle` (or :meth:`refuse`) for each
    record in offset order, then :meth:`persist`,
    and once the batch's records are acknowledged and its offsets committed,
    :meth:`committed`. Rebalances call :meth:`revoked` after the partitions'
    last commit and :meth:`assigned` when partitions arrive.
    """

    #: The ``service`` label of the metrics and dead letters.
    name = "consumer"

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.sessions: SessionTable[S] = SessionTable(config.hot_sessions)
        self.tally = Tally()
        self._outputs: Outputs | None = None
        self._store: StoreT | None = None  # what open_store() opened, until close()

    async def open(self, outputs: Outputs) -> None:
        """Before the first batch: keep ``outputs``, open the service's store."""
        self._outputs = outputs
        self._store = self.open_store()

    def open_store(self) -> StoreT | None:
        """The service's file(s) (``None``: it keeps none)."""
        return None

    @property
    def outputs(self) -> Outputs:
        """The outputs :meth:`open` was given."""
        if self._outputs is None:
            raise PipelineError(f"the {self.name} service's outputs are used before it was opened")
        return self._outputs

    @property
    def is_open(self) -> bool:
        """Between :meth:`open` and :meth:`close`, with a store."""
        return self._store is not None

    @property
    def store(self) -> StoreT:
        """What :meth:`open_store` opened, until :meth:`close`."""
        if self._store is None:
            raise PipelineError(f"the {self.name} service's store is used while it is not open")
        return self._store

    async def close(self, drained: bool) -> None:
        """Close the store (idempotent); ``drained`` when everything handled
        was persisted and committed."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def prepare(self, session_ids: set[str]) -> None:
        """Before a batch's records: the sessions it names (a store may
        look them up at once instead of one by one)."""

    @abstractmethod
    def handle(self, record: KafkaRecord, decoded: SessionRecord) -> None:
        """Apply one record; raise a :class:`DshError` to refuse it."""

    def refuse(self, error: DshError, record: KafkaRecord) -> bool:
        """A record that could not be decoded or that :meth:`handle`
        refused: dead-lettered with its reason and coordinates; ``False``
        when it already is (:meth:`.Outputs.dead_letter`)."""
        return self.outputs.dead_letter(record, error)

    @abstractmethod
    def persist(self) -> None:
        """Make every effect of the records handled so far durable (records
        for the outputs are queued with ``outputs.send``)."""

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        """The last :meth:`persist`'s records were acknowledged and these
        offsets committed."""

    async def assigned(self, partitions: set[TopicPartition], committed: CommittedOffset) -> None:
        """Partitions arrived; ``committed`` asks the cluster for one's
        committed offset (``None``: nothing committed yet)."""

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        """Partitions left after their last commit: another member continues
        their sessions, so what this one holds of them is stale."""
        self.sessions.drop_partitions({tp.partition for tp in partitions})
