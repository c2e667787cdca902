"""A v4 fold's state as explicit msgspec Structs, and back.

:func:`save` turns a :class:`~dsh_core.formats.v4.fold.V4Fold` into a
:class:`V4FoldState` (tagged ``v4``; a v3 fold's, :mod:`dsh_core.formats.v3.snapshot`,
holds one), :func:`restore` builds the fold again; :mod:`dsh_core.formats.snapshots`
writes it as JSON behind its layout line. Nothing in it names a module or a
class: JSON values are saved as they are, the errors a fold keeps by the
stable names of :data:`ERRORS`, and the markers
:data:`~dsh_core.formats.v4.relationships.ABSENT` and ``NO_SOURCE`` as what they
mean (an omitted field, a list of seqs).

Evolution follows msgspec's rules: a new field gets a default and keeps
reading older snapshots; a field is never renamed or given another meaning;
an error class renamed keeps its key in :data:`ERRORS`. Anything else is a
new layout of :mod:`dsh_core.formats.snapshots`.
"""

from __future__ import annotations

from typing import Any, Mapping, overload

import msgspec
from msgspec import UNSET, UnsetType

from ...errors import (CorruptionError, DecodeError, DshError, FormatUnsupportedError, IdentityError, SurfaceError,
                      ValidationError)
from ...jsonvalue import dump_json, freeze
from ...session_header import SessionHeader
from .admission import AdmissionError
from .images import ImageOffloadError
from .lifecycle import Relationships, _Compaction
from .fold import V4Fold
from .lookback import NO_SOURCE, ToolsBySeq
from .relationships import ABSENT, RelationshipError
from .rows import RowError
from .session import AdoptionError, V4State

__all__ = ["ERRORS", "Error", "V4FoldState", "error_of", "exception_of", "restore", "save"]

#: The errors a fold may keep, by the name its snapshot saves them under.
ERRORS: dict[str, type[DshError]] = {
    "DshError": DshError,
    "DecodeError": DecodeError,
    "CorruptionError": CorruptionError,
    "FormatUnsupportedError": FormatUnsupportedError,
    "ValidationError": ValidationError,
    "SurfaceError": SurfaceError,
    "IdentityError": IdentityError,
    "ImageOffloadError": ImageOffloadError,
    "RelationshipError": RelationshipError,
    "AdmissionError": AdmissionError,
    "AdoptionError": AdoptionError,
    "RowError": RowError,
}
_NAMES = {cls: name for name, cls in ERRORS.items()}


class Error(msgspec.Struct, frozen=True, array_like=True):
    """A kept refusal: its :data:`ERRORS` name and message."""

    kind: str
    message: str


class Tools(msgspec.Struct, frozen=True):
    """A :class:`~dsh_core.formats.v4.lookback.ToolsBySeq`: each distinct toolset once."""

    toolsets: list[Any]
    by_seq: list[tuple[int, int]]  # (request/header seq, index into toolsets)


class Compaction(msgspec.Struct, frozen=True):
    """The open compaction; ``command`` unset: its start named no ``sourceCommandId``."""

    id: str
    turn: int | None
    seq: int
    summarized: bool
    command: Any | UnsetType = UNSET


class Lifecycle(msgspec.Struct, frozen=True):
    """A :class:`~dsh_core.formats.v4.lifecycle.Relationships`; maps are ``(key, value)`` lists, in order."""

    turn: int | None
    step: int | None
    next_turn: int
    next_step: int
    provider: Any
    surface: list[int]
    protected_head: int | None
    compaction: Compaction | None
    tools: list[tuple[str, Any]]
    dispatches: list[tuple[str, Any]]
    retries: list[Any]
    started_retries: list[tuple[str, int]]
    commands: list[str]
    types: list[Any]
    header_tools: Tools
    user_kinds: list[tuple[int, Any]]  # the source kind of each user/message with a source object ...
    sourceless: list[int]  # ... and the user/messages without one
    open_start: int | None
    cut_off: list[int]
    completed: list[int]
    crossing: tuple[int, Error] | None
    held: Error | None
    error: Error | None


class Surface(msgspec.Struct, frozen=True):
    """A :class:`~dsh_core.formats.v4.session.V4State`; ``events`` ``None``: left out by the caller."""

    session_id: str
    next_seq: int
    last_time: int | None
    nodes: list[int]
    replace_generation: int
    events: list[tuple[int, str, Any]] | None
    projected: list[tuple[int, Any]]
    header_tools: Tools
    header: Any
    context: Any


class V4FoldState(msgspec.Struct, frozen=True, tag="v4", tag_field="format"):
    """A :class:`~dsh_core.formats.v4.fold.V4Fold` (its observer is the caller's)."""

    header: SessionHeader | None
    state: Surface | None
    count: int
    line_no: int
    folder: str | None
    migrated: bool
    source_version: int
    inherited: int | None
    foreign_delivery: int | None
    lifecycle: Lifecycle
    issue: Error | None
    local_error: tuple[int, Error] | None
    artifact_error: Error | None
    vocabulary_error: Error | None
    adoption_error: Error | None
    fold_error: Error | None
    admission_error: Error | None


# ------------------------------------------------------------------ saving


@overload
def error_of(exc: DshError, names: Mapping[type, str] = ...) -> Error: ...


@overload
def error_of(exc: None, names: Mapping[type, str] = ...) -> None: ...


@overload
def error_of(exc: DshError | None, names: Mapping[type, str] = ...) -> Error | None: ...


def error_of(exc: DshError | None, names: Mapping[type, str] = _NAMES) -> Error | None:
    """``exc`` saved by the name ``names`` gives its class (or its nearest base)."""
    if exc is None:
        return None
    cls = next(cls for cls in type(exc).__mro__ if cls in names)  # DshError itself is named
    return Error(names[cls], exc.message)


_error = error_of


def _tools(tools: ToolsBySeq) -> Tools:
    index: dict[int, int] = {}
    toolsets: list[Any] = []
    by_seq = []
    for seq, toolset in tools._by_seq.items():
        if id(toolset) not in index:
            index[id(toolset)] = len(toolsets)
            toolsets.append(toolset)
        by_seq.append((seq, index[id(toolset)]))
    return Tools(toolsets, by_seq)


def _lifecycle(rel: Relationships) -> Lifecycle:
    compaction = rel.compaction
    return Lifecycle(
        turn=rel.turn, step=rel.step, next_turn=rel.next_turn, next_step=rel.next_step, provider=rel.provider,
        surface=list(rel.surface), protected_head=rel.protected_head,
        compaction=None if compaction is None else Compaction(
            compaction.id, compaction.turn, compaction.seq, compaction.summarized,
            UNSET if compaction.command is ABSENT else compaction.command),
        tools=list(rel.tools.items()), dispatches=list(rel.dispatches.items()), retries=list(rel.retries),
        started_retries=sorted(rel.started_retries), commands=sorted(rel.commands), types=list(rel.types),
        header_tools=_tools(rel.header_tools),
        user_kinds=[(seq, kind) for seq, kind in rel.user_kinds.items() if kind is not NO_SOURCE],
        sourceless=[seq for seq, kind in rel.user_kinds.items() if kind is NO_SOURCE],
        open_start=rel._open_start, cut_off=sorted(rel._cut_off), completed=sorted(rel._completed),
        crossing=None if rel._crossing is None else (rel._crossing[0], _error(rel._crossing[1])),
        held=_error(rel._held), error=_error(rel.error))


def _surface(state: V4State, with_events: bool) -> Surface:
    return Surface(
        session_id=state.session_id, next_seq=state.next_seq, last_time=state.last_time,
        nodes=list(state.surface.nodes), replace_generation=state.surface.replace_generation,
        events=[(seq, kind, data) for seq, (kind, data) in state._events.items()] if with_events else None,
        projected=list(state._projected.items()), header_tools=_tools(state._header_tools), header=state.header,
        context=state.context)


def _v4(fold: V4Fold, with_events: bool) -> V4FoldState:
    local = fold._local_error
    return V4FoldState(
        header=fold.header, state=None if fold.state is None else _surface(fold.state, with_events), count=fold.count,
        line_no=fold._line_no, folder=fold.folder, migrated=fold.migrated, source_version=fold.source_version,
        inherited=fold._inherited, foreign_delivery=fold._foreign_delivery, lifecycle=_lifecycle(fold._relationships),
        issue=_error(fold._issue), local_error=None if local is None else (local[0], _error(local[1])),
        artifact_error=_error(fold._artifact_error), vocabulary_error=_error(fold._vocabulary_error),
        adoption_error=_error(fold._adoption_error), fold_error=_error(fold._fold_error),
        admission_error=_error(fold._admission_error))


def save(fold: V4Fold, with_surface_events: bool = True) -> V4FoldState:
    """The state of ``fold``; without ``with_surface_events`` the data of the
    current surface events is left out."""
    return _v4(fold, with_surface_events)


# ------------------------------------------------------------------ restoring


def exception_of(saved: Error | None, errors: Mapping[str, type[DshError]] = ERRORS) -> Any:
    """The error :func:`error_of` saved, of the class ``errors`` names."""
    if saved is None:
        return None
    cls = errors.get(saved.kind)
    if cls is None:  # a later build's, or a renamed class whose old name was not kept
        raise FormatUnsupportedError(f"it keeps an error of unknown kind {saved.kind!r}")
    return cls(saved.message)


_exception = exception_of


def _tools_by_seq(saved: Tools) -> ToolsBySeq:
    tools = ToolsBySeq()
    for toolset in saved.toolsets:
        tools._distinct[dump_json(toolset)] = toolset
    for seq, index in saved.by_seq:
        if not 0 <= index < len(saved.toolsets):
            raise DecodeError(f"the request/header at seq {seq} names toolset {index} of {len(saved.toolsets)}")
        tools._by_seq[seq] = saved.toolsets[index]
    return tools


def _relationships(saved: Lifecycle) -> Relationships:
    rel = Relationships()
    rel.turn, rel.step, rel.next_turn, rel.next_step = saved.turn, saved.step, saved.next_turn, saved.next_step
    rel.provider, rel.surface, rel.protected_head = saved.provider, saved.surface, saved.protected_head
    if saved.compaction is not None:
        compaction = saved.compaction
        rel.compaction = _Compaction(compaction.id, ABSENT if compaction.command is UNSET else compaction.command,
                                     compaction.turn, compaction.seq)
        rel.compaction.summarized = compaction.summarized
    rel.tools, rel.dispatches, rel.retries = dict(saved.tools), dict(saved.dispatches), saved.retries
    rel.started_retries = set(saved.started_retries)
    rel.commands, rel.types = set(saved.commands), saved.types
    rel.header_tools = _tools_by_seq(saved.header_tools)
    rel.user_kinds = dict(saved.user_kinds) | dict.fromkeys(saved.sourceless, NO_SOURCE)
    rel._open_start, rel._cut_off, rel._completed = saved.open_start, set(saved.cut_off), set(saved.completed)
    rel._crossing = None if saved.crossing is None else (saved.crossing[0], _exception(saved.crossing[1]))
    rel._held, rel.error = _exception(saved.held), _exception(saved.error)
    return rel


def _state(saved: Surface, surface_events: list[tuple[int, str, Any]] | None) -> V4State:
    state = V4State(saved.session_id)
    state.next_seq, state.last_time = saved.next_seq, saved.last_time
    state.surface.nodes, state.surface.replace_generation = saved.nodes, saved.replace_generation
    events = saved.events if saved.events is not None else surface_events or ()
    state._events = {seq: (kind, freeze(data)) for seq, kind, data in events}
    state._projected = {seq: freeze(message) for seq, message in saved.projected}
    state._header_tools = _tools_by_seq(saved.header_tools)
    state.header, state.context = freeze(saved.header), freeze(saved.context)
    return state


def _fold(saved: V4FoldState, where: str, observer: Any,
          surface_events: list[tuple[int, str, Any]] | None) -> V4Fold:
    fold = V4Fold(where, observer, migrated=saved.migrated, folder=saved.folder)
    fold.source_version = saved.source_version
    fold.header, fold.count, fold._line_no = saved.header, saved.count, saved.line_no
    fold.state = None if saved.state is None else _state(saved.state, surface_events)
    fold._inherited, fold._foreign_delivery = saved.inherited, saved.foreign_delivery
    fold._relationships = _relationships(saved.lifecycle)
    fold._issue = _exception(saved.issue)
    fold._local_error = None if saved.local_error is None else (saved.local_error[0],
                                                                 _exception(saved.local_error[1]))
    fold._artifact_error, fold._vocabulary_error = _exception(saved.artifact_error), _exception(saved.vocabulary_error)
    fold._adoption_error, fold._fold_error = _exception(saved.adoption_error), _exception(saved.fold_error)
    fold._admission_error = _exception(saved.admission_error)
    return fold


def restore(saved: V4FoldState, where: str, observer: Any,
            surface_events: list[tuple[int, str, Any]] | None = None) -> V4Fold:
    """The fold :func:`save` saved, named ``where`` and watched by
    ``observer``; ``surface_events`` gives the ``(seq, type, data)`` rows a
    state saved without them left out. Raises :class:`FormatUnsupportedError`
    for an error name :data:`ERRORS` lacks and :class:`DecodeError` for a
    state that contradicts itself (the caller names where)."""
    return _fold(saved, where, observer, surface_events)
