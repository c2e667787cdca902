"""Loading a stored session file: its framing read by :mod:`dsh_core.storage.reader`,
each line fed to the fold of the log's format (:func:`dsh_core.formats.open_fold`).

:func:`load_session` reads a file in dsh's layout (its name gives the
generation, its folder the session id), :func:`load_session_bytes` a
log's bytes; both give a :class:`~dsh_core.storage.reader.LoadResult`.
:func:`read_events` lists a file's stored events without validation.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable

from .errors import CorruptionError, DecodeError, DshError, FormatUnsupportedError
from .events import is_row
from .formats import FoldObserver, SessionFold, open_fold, read_header
from .jsonvalue import decode_json
from .session_header import SessionHeader
from .storage.layout import Compression, compression_of, generation_of
from .storage.reader import LoadResult, read_framed, read_lines
from .storage.records import decode_row

__all__ = ["load_session", "load_session_bytes", "read_events"]


def load_session(path: str | os.PathLike[str], observer: FoldObserver | None = None,
                 compression: Compression | None = None, keep_migrated: bool = False,
                 children: list[Any] | None = None) -> LoadResult:
    """Load a stored session file (raw ``.jsonl`` or ``.jsonl.zstd``); with
    ``keep_migrated`` a migrated log's events (v3's, as migrated to v4) are
    kept in the result, catalogued with its subagent ``children`` as dsh's
    migration does."""
    compression = compression or compression_of(path)
    with open(path, "rb") as stream:
        return _load(stream, str(path), compression, observer, keep_migrated, children or [])


def load_session_bytes(data: bytes, source: str = "<bytes>", compression: Compression = "none",
                       observer: FoldObserver | None = None) -> LoadResult:
    """Load a stored session from its bytes."""
    return _load(io.BytesIO(data), source, compression, observer)


class _EventCollector:
    """A sink that keeps the header and every event (rows expanded), as stored."""

    tolerates_defects = False

    def __init__(self, where: str) -> None:
        self.where = where
        self.header: SessionHeader | None = None
        self.events: list[Any] = []

    def header_line(self, line: bytes) -> None:
        self.header = read_header(line, self.where)

    def event_line(self, line: bytes) -> bool:
        try:
            value = decode_json(line)
            if is_row(value):
                self.events.extend(decode_row(value).expand())
            else:
                self.events.append(value)
        except DecodeError:
            return False
        return True


def read_events(path: str | os.PathLike[str]) -> tuple[SessionHeader, list[Any]]:
    """The header and every stored event of a file (rows expanded, complete
    records only, no validation): for comparisons and tools, not for loads."""
    collector = _EventCollector(str(path))
    read_lines(path, collector)
    assert collector.header is not None
    return collector.header, collector.events


class _FormatSink:
    """Opens the fold of the header line's format (:func:`~dsh_core.formats.open_fold`)
    and hands it every later line: ``event_line`` is then the fold's own, so
    a line costs no call of the sink's."""

    #: the fold's ``event_line``, set by :meth:`header_line` (which the readers call first)
    event_line: Callable[[bytes], bool]

    def __init__(self, where: str, observer: FoldObserver | None, generation: int | None,
                 keep_migrated: bool = False, children: list[Any] | None = None) -> None:
        self.where = where
        self.keep_migrated = keep_migrated
        self.children = children
        self.observer = observer
        self.generation = generation
        self.fold: SessionFold | None = None

    def header_line(self, line: bytes) -> None:
        folder = Path(self.where).parent.name if self.generation else None
        self.fold = open_fold(line, self.where, self.observer, generation=self.generation, folder=folder,
                              keep_migrated=self.keep_migrated, children=self.children)
        self.event_line = self.fold.event_line

    @property
    def tolerates_defects(self) -> bool:
        """Whether a defective line just ends the log (v3, as dsh migrates it)."""
        return self.fold is not None and self.fold.tolerates_defects


def _load(stream: BinaryIO, source: str, compression: Compression, observer: FoldObserver | None,
          keep_migrated: bool = False, children: list[Any] | None = None) -> LoadResult:
    result = LoadResult(source=source, compression=compression)
    sink = _FormatSink(source, observer, generation_of(source), keep_migrated, children)
    try:
        read_framed(stream, compression, sink, result)
    except (CorruptionError, FormatUnsupportedError) as exc:
        result.header = sink.fold.header if sink.fold is not None else None
        result.error = exc
        return result
    fold = sink.fold
    assert fold is not None
    result.header, result.stored_count = fold.header, fold.count
    try:
        result.closers = fold.finish()
    except DshError as exc:
        result.error = exc
        return result
    result.state = fold.state
    result.migrated_events = fold.migrated_events
    result.event_count = fold.event_count + len(result.closers)
    return result
