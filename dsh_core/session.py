"""Session logs: the validated incremental fold and the live ``SessionLog``.

:class:`SessionState` is the one place where an event is checked against the
seed/load rules (envelope, retired vocabulary, request header, message shape,
seq contiguity, surface) and folded into surface, derived history, request
header and request context. The staged fold (:mod:`dsh_core.formats.v0.fold`, behind
loads and consumers) and :class:`SessionLog` drive it; neither keeps a second
copy of these rules.
"""

from __future__ import annotations

import time as _time
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import msgspec
from msgspec import UNSET

from .derive import DerivedHistory, derive_event_message
from .errors import EnvelopeError, ForkError
from .events import RETIRED_TYPES, SURFACE_TYPES, Event, event_from_json
from .request_header import canonical_header
from .jsonvalue import FrozenDict, freeze, thaw
from .lossless import snapshot
from .session_header import SessionHeader
from .shapes import check_envelope, check_message_shape, check_request_header, check_retired
from .surface import Replacement, Surface

__all__ = ["SessionState", "SessionStateSnapshot", "SessionLog", "now_ms"]

# Types whose payload shapes or vocabulary are checked beyond the envelope.
_SHAPED_TYPES = SURFACE_TYPES | RETIRED_TYPES | {"request/header"}


def now_ms() -> int:
    """Wall-clock Unix epoch milliseconds (dsh's ``time``)."""
    return _time.time_ns() // 1_000_000


class SessionStateSnapshot(msgspec.Struct, frozen=True):
    """What :meth:`SessionState.snapshot` saves: everything later events need."""

    session_id: str
    next_seq: int
    last_time: int | None
    nodes: list[int]
    replace_generation: int
    #: ``(seq, type, data)`` of each current surface event; ``None`` when left out
    surface_events: list[tuple[int, str, Any]] | None
    header: Any  # the folded request header, or None
    context: Any  # the latest request/context payload, or None


class SessionState:
    """Incremental, validated fold of one session's events.

    Keeps only what later events and derivation need: surface nodes, the data
    of surface events, the folded request header and context. Chunk events
    are counted, never stored.
    """

    __slots__ = ("session_id", "next_seq", "surface", "history", "header", "context",
                 "last_time", "_surface_events")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.next_seq = 0
        self.surface = Surface()
        self._surface_events: dict[int, tuple[str, Any]] = {}
        self.history = DerivedHistory(self._project)
        self.header: FrozenDict | None = None
        self.context: Any = None
        self.last_time: int | None = None

    def _project(self, seq: int) -> Any:
        return derive_event_message(*self._surface_events[seq])

    def _data_at(self, seq: int) -> tuple[str, Any]:
        return self._surface_events[seq]

    def message_id_at(self, seq: Any) -> Any:
        """The message id of the current surface node ``seq``, or ``None``."""
        found = self._surface_events.get(seq)
        if found is None:
            return None
        event_type, data = found
        return (data if event_type == "user/message" else data["message"]).get("id")

    def check_and_apply(self, event: dict[str, Any], *, messages_checked: bool = False,
                        envelope_checked: bool = False) -> Replacement | None:
        """Validate one decoded event object at the next seq and fold it.

        Order follows the reference's seed validation: envelope, message and
        header shapes, retired vocabulary, seq contiguity, then surface rules.
        ``messages_checked`` and ``envelope_checked`` skip the message-shape
        and envelope checks for a caller (the staged fold) that already
        made them. Raises a
        :class:`~dsh_core.errors.ValidationError` and leaves the state
        unchanged when the event is refused. Returns the replacement a
        ``replace`` made, so callers can keep a history of them.
        """
        index = self.next_seq
        if not envelope_checked:
            check_envelope(event, index)
        event_type = event["type"]
        seq = event["seq"]
        data = event["data"]
        if event_type in _SHAPED_TYPES:
            def where() -> str:
                return f'session {self.session_id!r} seq {seq} "{event_type}"'
            if event_type == "request/header":
                check_request_header(data, where)
            elif event_type in SURFACE_TYPES and not messages_checked:
                check_message_shape(event_type, data, where)
            check_retired(event_type, data, where)
        if seq != index:
            raise EnvelopeError(f"session {self.session_id!r}: event seq {seq} is not contiguous; expected {index}")
        admitted = self.surface.admit(event_type, seq, data, event.get("surfaceOp"), event.get("sourceEventSeqs"),
                                      "surfaceOp" in event, "sourceEventSeqs" in event, self._data_at)
        replaced = None
        if admitted is not False:
            # Only current nodes are kept (frozen once, shared by derivation):
            # a shadowed node can never return, so memory follows the history.
            self._surface_events[seq] = (event_type, freeze(data))
            if admitted is not True:
                replaced = admitted
                for shadowed in replaced.shadowed_seqs:
                    del self._surface_events[shadowed]
        elif event_type == "request/header":
            self.header = canonical_header(data["header"])
        elif event_type == "request/context":
            self.context = data
        self.next_seq = seq + 1
        self.last_time = event["time"]
        return replaced

    def apply_chunk_run(self, seq0: int, count: int, last_time: int) -> None:
        """Fold ``count`` validated ``assistant/chunk`` events from ``seq0``
        (a decoded packed row): chunks never touch surface or headers."""
        if seq0 != self.next_seq:
            raise EnvelopeError(f"session {self.session_id!r}: event seq {seq0} is not contiguous; expected {self.next_seq}")
        self.next_seq = seq0 + count
        self.last_time = last_time

    def messages(self) -> list[Any]:
        """The derived history now: a fresh list of shared frozen messages."""
        return self.history.messages(self.surface.nodes, self.surface.replace_generation)

    def current_messages(self) -> list[Any]:
        """The derived history now, without a copy: the cached list itself,
        which later events change (callers must not mutate or keep it)."""
        return self.history.current(self.surface.nodes, self.surface.replace_generation)

    def message_count(self) -> int:
        return len(self.current_messages())

    def surface_events(self) -> Mapping[int, tuple[str, Any]]:
        """The current surface events, seq → ``(type, frozen data)``: a
        read-only live view, which later events change."""
        return MappingProxyType(self._surface_events)

    def snapshot(self, with_surface_events: bool = True) -> SessionStateSnapshot:
        """The state's fields, detached from it. Without ``with_surface_events``
        the data of the current surface events is left out (a caller that
        keeps those itself hands them back to :meth:`restore`)."""
        events = ([(seq, kind, data) for seq, (kind, data) in self._surface_events.items()]
                  if with_surface_events else None)
        return SessionStateSnapshot(self.session_id, self.next_seq, self.last_time, list(self.surface.nodes),
                                    self.surface.replace_generation, events, self.header, self.context)

    @classmethod
    def restore(cls, saved: SessionStateSnapshot,
                surface_events: Iterable[tuple[int, str, Any]] | None = None) -> "SessionState":
        """The state :meth:`snapshot` saved; ``surface_events`` gives the
        ``(seq, type, data)`` rows of a snapshot made without them. Payloads,
        request header and context are frozen again."""
        state = cls(saved.session_id)
        state.next_seq, state.last_time = saved.next_seq, saved.last_time
        state.surface.nodes = list(saved.nodes)
        state.surface.replace_generation = saved.replace_generation
        rows = saved.surface_events if saved.surface_events is not None else surface_events or ()
        state._surface_events = {seq: (kind, freeze(data)) for seq, kind, data in rows}
        state.header = freeze(saved.header)
        state.context = freeze(saved.context)
        return state


class SessionLog:
    """An append-only session log with the spec's append, seed and fork rules.

    ``seed`` (replay, resume, fork) is validated event by event like a load;
    a seeded log then gets a ``session/end-seed`` marker unless the seed ends
    with one. ``clock`` returns epoch milliseconds (inject one in tests).
    """

    def __init__(self, session_id: str, seed: Iterable[Event | dict[str, Any]] | None = None, *,
                 header: SessionHeader | None = None, clock: Callable[[], int] = now_ms) -> None:
        self._clock = clock
        self._state = SessionState(session_id)
        self._events: list[Event] = []
        self._replacements: list[Replacement] = []
        self._snapshot: tuple[Event, ...] | None = None
        self.header = header if header is not None else SessionHeader(id=session_id, createdAt=clock(), delegationDepth=0)
        if self.header.id != session_id:
            raise EnvelopeError(f"session header id {self.header.id!r} does not match session id {session_id!r}")
        if seed is None:
            return
        for index, item in enumerate(seed):
            obj = thaw(item.to_dict()) if isinstance(item, Event) else item
            self._admit(snapshot(obj, f"seed event at index {index}"))
        if not self._events or self._events[-1].type != "session/end-seed":
            self.append("session/end-seed", {})

    # ------------------------------------------------------------ appending

    def _admit(self, obj: dict[str, Any]) -> Event:
        replaced = self._state.check_and_apply(obj)
        if replaced is not None:
            self._replacements.append(replaced)
        event = event_from_json(obj)
        self._events.append(event)
        self._snapshot = None
        return event

    def append(self, event_type: str, data: Any, *, surface_op: Any = UNSET,
               source_event_seqs: Any = UNSET, ignorable: bool = False) -> Event:
        """Append one event; returns the logged (detached, frozen) event.

        ``data`` must be lossless JSON; surface types need ``surface_op``.
        Nothing changes when the event is refused.
        """
        where = f'session {self._state.session_id!r} seq {self._state.next_seq} "{event_type}"'
        obj: dict[str, Any] = {"type": event_type, "seq": self._state.next_seq, "time": self._clock(),
                               "data": snapshot(data, where)}
        if ignorable:
            obj["ignorable"] = True
        if source_event_seqs is not UNSET:
            obj["sourceEventSeqs"] = snapshot(source_event_seqs, where)
        if surface_op is not UNSET:
            obj["surfaceOp"] = snapshot(surface_op, where)
        return self._admit(obj)

    # ------------------------------------------------------------- reading

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def seq(self) -> int:
        """The seq the next appended event gets (the log length)."""
        return self._state.next_seq

    @property
    def events(self) -> tuple[Event, ...]:
        """An immutable snapshot of the log; it does not grow later."""
        if self._snapshot is None:
            self._snapshot = tuple(self._events)
        return self._snapshot

    @property
    def surface_nodes(self) -> tuple[int, ...]:
        return tuple(self._state.surface.nodes)

    @property
    def replace_generation(self) -> int:
        return self._state.surface.replace_generation

    @property
    def replacements(self) -> tuple[Replacement, ...]:
        return tuple(self._replacements)

    def derive_messages(self) -> list[Any]:
        """The model history now: a fresh list of frozen messages."""
        return self._state.messages()

    def request_header(self) -> Any:
        """The canonical request header in force, or ``None``."""
        return self._state.header

    def request_context(self) -> Any:
        """The latest ``request/context`` payload, or ``None``."""
        return self._state.context

    def fork(self, child_id: str, boundary: int | None = None) -> "SessionLog":
        """A child session seeded with events ``0..boundary`` (default: last).

        Refused when the boundary is not an existing seq or lies inside an
        open turn (the last turn marker at or before it is a ``turn/start``).
        """
        if not self._events:
            raise ForkError(f"session {self.session_id!r} has no events to fork")
        last = len(self._events) - 1
        boundary = last if boundary is None else boundary
        if type(boundary) is not int or not 0 <= boundary <= last:
            raise ForkError(f"session {self.session_id!r}: fork boundary {boundary!r} is not an existing seq (0..{last})")
        for event in reversed(self._events[:boundary + 1]):
            if event.type == "turn/start":
                raise ForkError(f"session {self.session_id!r}: fork boundary {boundary} lies inside open turn {event.data.get('turn')!r}")
            if event.type == "turn/end":
                break
        seed = self._events[:boundary + 1]
        child_header = SessionHeader(id=child_id, createdAt=self._clock(), cwd=self.header.cwd,
                                     parentSession=self.session_id, seedLength=len(seed),
                                     delegationDepth=0)
        return SessionLog(child_id, seed, header=child_header, clock=self._clock)
