"""What every session format provides: its fold (:class:`SessionFold`), how
the fold is saved (:class:`SnapshotCodec`), and the :class:`Format` record
the registry (:mod:`dsh_core.formats.registry`) lists it by.

A fold reads one session log, a storage line at a time: ``event_line`` with
a file's crash-tail rules, ``apply`` for a consumer's record at the next
seq. It is read the same way whatever the format: ``header``, ``count``
(stored records folded), ``event_count`` (events in the fold's own terms:
of a v3 log, as migrated to v4), ``state`` (surface, derived messages,
request header and context), ``error`` (the refusal so far), ``idle`` (no
turn open) and ``finish()``. Callers never branch on the fold's class or
version: what differs between formats is a field of its :class:`Format`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

from ..analysis import AnalysisSnapshot
from ..errors import DshError
from ..session_header import SessionHeader
from ..storage.records import ChunkRow
from ..wire_request import Wire

__all__ = ["FoldObserver", "FoldOptions", "Format", "SessionFold", "SnapshotCodec", "SurfaceRows", "opened_header"]

#: ``(seq, type, data)`` of the current surface events a snapshot left out.
SurfaceRows = list[tuple[int, str, Any]]


class FoldObserver(Protocol):
    """Follows a load as it folds (only while no stage has failed).

    ``before_event``/``after_event`` see every event of ``watched_types``
    (others may be folded without building their payloads).
    """

    watched_types: frozenset[str]

    def before_event(self, event: dict[str, Any], state: Any) -> None: ...

    def after_event(self, event: dict[str, Any], state: Any) -> None: ...

    def chunk_run(self, row: ChunkRow, state: Any) -> None: ...


class SessionFold(Protocol):
    """The fold of one session log of some format (see the module's text)."""

    #: the header version of the logs this fold reads (its :class:`Format`'s key)
    format_version: ClassVar[int]
    #: whether a defective line in a complete zstd frame just ends the log
    #: (dsh's migrating readers keep the prefix) rather than corrupting it
    tolerates_defects: ClassVar[bool]
    where: str
    count: int

    @property
    def observer(self) -> Any:
        """What follows the fold (a :class:`FoldObserver`, or ``None``); fixed when it is opened."""
        ...

    @property
    def header(self) -> SessionHeader | None: ...

    @property
    def state(self) -> Any:
        """What is folded so far: a :class:`~dsh_core.session.SessionState` (v0) or a
        :class:`~dsh_core.formats.v4.session.V4State` (v3/v4), each with the surface,
        ``messages()``, ``surface_events()``, ``header`` and ``context``."""
        ...

    @property
    def event_count(self) -> int: ...

    @property
    def migrated_events(self) -> list[dict[str, Any]] | None: ...

    @property
    def error(self) -> DshError | None: ...

    @property
    def idle(self) -> bool: ...

    def event_line(self, line: bytes) -> bool: ...

    def apply(self, line: bytes) -> None: ...

    def finish(self) -> list[dict[str, Any]]: ...


def opened_header(fold: SessionFold) -> SessionHeader:
    """The header of a fold :func:`~.registry.open_fold` or a snapshot's
    restore gave: each reads the header first, so it is never ``None``."""
    header = fold.header
    assert header is not None, "an opened fold has read its header"
    return header


class SnapshotCodec(Protocol):
    """A snapshot layout: a fold's saved state (a format's msgspec Struct)
    and an observer's analysis, as bytes and back."""

    def matches(self, blob: bytes) -> bool:
        """Whether ``blob`` is of this layout (its first bytes say)."""
        ...

    def write(self, state: Any, analysis: AnalysisSnapshot | None) -> bytes: ...

    def read(self, blob: bytes, where: str,
             surface_events: SurfaceRows | None) -> tuple[Any, AnalysisSnapshot | None]:
        """The saved state and analysis; raises :class:`~dsh_core.errors.DecodeError`
        or :class:`~dsh_core.errors.FormatUnsupportedError` naming ``where``."""
        ...


@dataclass(frozen=True)
class FoldOptions:
    """How a fold is opened, beyond its header: what a file's place says,
    and what a migration keeps (formats that migrate nothing ignore those)."""

    #: the session folder the log was read from (dsh's layout): a v3/v4 header's id must be its
    folder: str | None = None
    #: keep every event as migrated to the current format (:attr:`SessionFold.migrated_events`)
    keep_migrated: bool = False
    #: with ``keep_migrated``, the subagent children dsh's migration catalogues at the log's end
    children: list[dict[str, Any]] = field(default_factory=list)


#: Opens a fold of a format: (decoded header line, the raw line, where,
#: observer, options), having read the header.
Opener = Callable[[Any, bytes, str, Any, FoldOptions], SessionFold]


@dataclass(frozen=True)
class Format:
    """One session format this build reads, as the registry lists it."""

    #: the header's ``version`` (and the generation in its file name)
    version: int
    #: where to read about it (a page of ``docs/formats``)
    name: str
    #: the raw file name dsh gives a log of this format (``.zstd`` added when compressed)
    file_name: str
    #: the fold of a log whose header reads so (see :data:`Opener`)
    open: Opener
    #: the header line, decoded, checked as this format's reader checks it
    read_header: Callable[[Any, str], SessionHeader]
    #: the wire a dsh runtime of this format sends its requests on (``None``: not rebuilt)
    wire: Wire | None
    #: whether dsh writes this format today (an older one is migrated to it)
    current: bool
    #: the fold's state as a msgspec Struct, and back (see :mod:`dsh_core.fold_snapshot`)
    state_type: type
    save: Callable[[Any, bool], Any]
    restore: Callable[[Any, str, Any, "SurfaceRows | None"], SessionFold]
    #: the snapshot layout its state is written in
    snapshots: SnapshotCodec
