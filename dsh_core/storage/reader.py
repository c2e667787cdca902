"""Reading a stored session file (docs/formats/v0.md §8.6–§8.9b): JSONL or zstd frames,
line by line, with dsh's torn-tail rules.

The framing readers feed each line to a sink; a load's sink is the
:class:`~dsh_core.fold.StagedFold`, which checks and folds it.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..errors import CorruptionError, DecodeError, DshError, FormatUnsupportedError
from ..events import is_row
from ..fold import FoldObserver
from ..folds import FoldState, SessionFold, open_fold, read_header
from ..jsonvalue import decode_json
from ..session_header import SessionHeader
from ..v4.v3 import V3Fold
from ..v4.catalog import catalog_children
from .framing import READ_SIZE, Frame, frame_pieces, frame_plaintext, iter_frames
from .layout import Compression, compression_of, generation_of
from .lines import MAX_LINE_BYTES, LineSplitter
from .records import decode_row

__all__ = ["LoadResult", "header_line_of", "load_session", "load_session_bytes", "read_events"]


@dataclass
class LoadResult:
    """What loading one stored session gave."""

    source: str
    compression: Compression
    header: SessionHeader | None = None
    error: DshError | None = None
    state: FoldState | None = None
    #: the session's events (of a v3 log, as migrated; plus any closers)
    event_count: int = 0
    stored_count: int = 0
    closers: list[dict[str, Any]] = field(default_factory=list)
    #: lines of a torn final zstd frame that joined the log (rewritten by repair)
    recovered_lines: list[bytes] = field(default_factory=list)
    #: a v3 log loaded with ``keep_migrated``: its events as migrated to v4
    migrated_events: list[dict[str, Any]] | None = None
    committed_bytes: int = 0
    file_bytes: int = 0
    dropped_text: str = ""

    @property
    def accepted(self) -> bool:
        return self.error is None

    @property
    def dropped_bytes(self) -> int:
        return self.file_bytes - self.committed_bytes if self.accepted else 0

    @property
    def repaired(self) -> bool:
        return self.accepted and (self.dropped_bytes > 0 or bool(self.closers))


class _LineSink(Protocol):
    """What the framing readers feed: the header line, then each record line."""

    where: str

    def header_line(self, line: bytes) -> None: ...

    def event_line(self, line: bytes) -> bool: ...


def _read_raw(stream: BinaryIO, pipeline: _LineSink, result: LoadResult) -> None:
    splitter = LineSplitter(pipeline.where)
    offset = 0
    header_done = False
    committed = 0
    while chunk := stream.read(READ_SIZE):
        for line in splitter.feed(chunk):
            offset += len(line) + 1
            if not header_done:
                pipeline.header_line(line)
                header_done = True
                committed = offset
            elif pipeline.event_line(line):
                committed = offset
    if not header_done:
        raise CorruptionError(f"{pipeline.where}: empty or header-less session log")
    result.file_bytes = offset + len(splitter.fragment)
    result.committed_bytes = committed
    if committed < result.file_bytes:
        stream.seek(committed)
        result.dropped_text = stream.read().decode("utf-8", "replace")


def _read_zstd(stream: BinaryIO, pipeline: _LineSink, result: LoadResult) -> None:
    where = pipeline.where
    splitter = LineSplitter(where)  # the text runs on across frames
    end = 0
    header_done = False
    in_prefix = True  # every line so far joined the committed prefix
    for frame in iter_frames(stream, where):
        if not frame.complete:
            if header_done:
                _read_torn_frame(stream, frame, pipeline, result, splitter)
                return
            break
        end = frame.end
        if not header_done:
            text = frame_plaintext(stream, frame, where, MAX_LINE_BYTES + 1)
            if not text or text.find(b"\n") != len(text) - 1:
                raise CorruptionError(f"{where}: corrupt Zstandard session log: first frame is not exactly one header line")
            pipeline.header_line(text[:-1])
            splitter.lines = 1
            header_done = True
            continue
        for piece in frame_pieces(stream, frame, where):
            for line in splitter.feed(piece):
                if not pipeline.event_line(line):
                    in_prefix = False
    if not header_done:
        raise CorruptionError(f"{where}: empty or header-less Zstandard session log")
    if splitter.fragment or (not in_prefix and not getattr(pipeline, "tolerates_defects", False)):
        raise CorruptionError(f"{where}: corrupt Zstandard session log: complete frame contains a torn or defective JSONL record")
    result.committed_bytes = result.file_bytes = end


def _read_torn_frame(stream: BinaryIO, frame: Frame, pipeline: _LineSink, result: LoadResult,
                     splitter: LineSplitter) -> None:
    """A torn final frame: the lines it completes that the log takes join
    it (to be rewritten by repair); the rest is dropped."""
    if splitter.fragment:
        raise CorruptionError(f"{pipeline.where}: corrupt Zstandard session log: complete frame contains a torn JSONL record")
    joined = True
    dropped: list[bytes] = []
    for piece in frame_pieces(stream, frame, pipeline.where):
        for line in splitter.feed(piece):
            joined = pipeline.event_line(line) and joined
            if joined:
                result.recovered_lines.append(line)
            else:
                dropped.append(line + b"\n")
    result.dropped_text = (b"".join(dropped) + splitter.fragment).decode("utf-8", "replace")
    result.committed_bytes = frame.start
    result.file_bytes = frame.end


def load_session(path: str | os.PathLike[str], observer: FoldObserver | None = None,
                 compression: Compression | None = None, keep_migrated: bool = False,
                 children: list[Any] | None = None) -> LoadResult:
    """Load a stored session file (raw ``.jsonl`` or ``.jsonl.zstd``); with
    ``keep_migrated`` a v3 log's migrated events are kept in the result,
    catalogued with its subagent ``children`` as dsh's migration does."""
    compression = compression or compression_of(path)
    with open(path, "rb") as stream:
        return _load(stream, str(path), compression, observer, keep_migrated, children or [])


def load_session_bytes(data: bytes, source: str = "<bytes>", compression: Compression = "none",
                       observer: FoldObserver | None = None) -> LoadResult:
    """Load a stored session from its bytes."""
    return _load(io.BytesIO(data), source, compression, observer)


class _EventCollector:
    """A sink that keeps the header and every event (rows expanded), as stored."""

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


def header_line_of(path: str | os.PathLike[str]) -> bytes:
    """The header line of a session file alone (the first line; of a zstd
    file, its first frame); raises :class:`CorruptionError` without one."""
    with open(path, "rb") as stream:
        if compression_of(path) != "zstd":
            line = stream.readline(READ_SIZE)
        else:
            frame = next(iter_frames(stream, str(path)), None)
            line = (frame_plaintext(stream, frame, str(path), MAX_LINE_BYTES + 1)
                    if frame is not None and frame.complete else b"")
    if not line.endswith(b"\n"):
        raise CorruptionError(f"{path}: no complete header line")
    return line[:-1]


def read_lines(path: str | os.PathLike[str], sink: _LineSink) -> LoadResult:
    """Feed ``sink`` the header line and each complete record line of a
    file, under the framing rules (a torn raw tail or torn last frame is not
    fed); a sink with ``tolerates_defects`` may refuse lines in a complete frame."""
    result = LoadResult(source=str(path), compression=compression_of(path))
    with open(path, "rb") as stream:
        (_read_zstd if compression_of(path) == "zstd" else _read_raw)(stream, sink, result)
    return result


class _FormatSink:
    """Opens the fold of the header line's format (:func:`~dsh_core.folds.open_fold`)
    and hands it every later line."""

    def __init__(self, where: str, observer: FoldObserver | None, generation: int | None,
                 keep_migrated: bool = False) -> None:
        self.where = where
        self.keep_migrated = keep_migrated
        self.observer = observer
        self.generation = generation
        self.fold: SessionFold | None = None

    def header_line(self, line: bytes) -> None:
        folder = Path(self.where).parent.name if self.generation else None
        self.fold = open_fold(line, self.where, self.observer, generation=self.generation, folder=folder,
                              keep_migrated=self.keep_migrated)

    def event_line(self, line: bytes) -> bool:
        assert self.fold is not None, "the readers hand the header line first"
        return self.fold.event_line(line)

    @property
    def tolerates_defects(self) -> bool:
        """Whether a defective line just ends the log (v3, as dsh migrates it)."""
        return isinstance(self.fold, V3Fold)


def _load(stream: BinaryIO, source: str, compression: Compression, observer: FoldObserver | None,
          keep_migrated: bool = False, children: list[Any] | None = None) -> LoadResult:
    result = LoadResult(source=source, compression=compression)
    sink = _FormatSink(source, observer, generation_of(source), keep_migrated)
    try:
        if compression == "zstd":
            _read_zstd(stream, sink, result)
        else:
            _read_raw(stream, sink, result)
    except (CorruptionError, FormatUnsupportedError) as exc:
        result.header = sink.fold.header if sink.fold is not None else None
        result.error = exc
        return result
    pipeline = sink.fold
    assert pipeline is not None, "a log without a header line is refused above"
    result.header, result.stored_count = pipeline.header, pipeline.count
    try:
        if isinstance(pipeline, V3Fold) and children:
            catalog_children(pipeline, children)
        result.closers = pipeline.finish()
    except DshError as exc:
        result.error = exc
        return result
    result.state = pipeline.state
    if isinstance(pipeline, V3Fold):
        result.migrated_events = pipeline.events
    count = pipeline.v4.count if isinstance(pipeline, V3Fold) else pipeline.count
    result.event_count = count + len(result.closers)
    return result
