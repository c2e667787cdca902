"""Reading a stored session file (docs/formats/v0.md §8.6–§8.9b): JSONL or zstd frames,
line by line, with dsh's torn-tail rules.

The framing readers feed each line to a sink; a load's sink (:mod:`dsh_core.loader`)
is the fold of the log's format, which checks and folds it.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..errors import CorruptionError, DshError
from ..session_header import SessionHeader
from .framing import READ_SIZE, Frame, frame_pieces, frame_plaintext, iter_frames
from .layout import Compression, compression_of
from .lines import MAX_LINE_BYTES, LineSplitter

__all__ = ["LineSink", "LoadResult", "header_line_from", "header_line_of", "read_framed", "read_lines"]


@dataclass
class LoadResult:
    """What loading one stored session gave."""

    source: str
    compression: Compression
    header: SessionHeader | None = None
    error: DshError | None = None
    state: Any = None  # the fold's state (a SessionState for v0, a V4State for v3/v4)
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


class LineSink(Protocol):
    """What the framing readers feed: the header line, then each record line.
    A sink that ``tolerates_defects`` may refuse lines in a complete zstd
    frame (the log ends there); any other makes that a corrupt log."""

    where: str

    @property
    def tolerates_defects(self) -> bool: ...

    def header_line(self, line: bytes) -> None: ...

    def event_line(self, line: bytes) -> bool: ...


def read_framed(stream: BinaryIO, compression: Compression, sink: LineSink, result: LoadResult) -> None:
    """Feed ``sink`` the header line and each complete record line of
    ``stream`` (raw JSONL, or zstd frames), noting in ``result`` the bytes
    read and what a torn tail dropped."""
    (_read_zstd if compression == "zstd" else _read_raw)(stream, sink, result)


def _read_raw(stream: BinaryIO, pipeline: LineSink, result: LoadResult) -> None:
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


def _read_zstd(stream: BinaryIO, pipeline: LineSink, result: LoadResult) -> None:
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
    if splitter.fragment or (not in_prefix and not pipeline.tolerates_defects):
        raise CorruptionError(f"{where}: corrupt Zstandard session log: complete frame contains a torn or defective JSONL record")
    result.committed_bytes = result.file_bytes = end


def _read_torn_frame(stream: BinaryIO, frame: Frame, pipeline: LineSink, result: LoadResult,
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


def header_line_of(path: str | os.PathLike[str]) -> bytes:
    """The header line of a session file alone (the first line; of a zstd
    file, its first frame); raises :class:`CorruptionError` without one."""
    with open(path, "rb") as stream:
        return header_line_from(stream, path)


def header_line_from(stream: BinaryIO, path: str | os.PathLike[str]) -> bytes:
    """:func:`header_line_of` the file ``stream`` (at its start) opened."""
    if compression_of(path) != "zstd":
        line = stream.readline(READ_SIZE)
    else:
        frame = next(iter_frames(stream, str(path)), None)
        line = (frame_plaintext(stream, frame, str(path), MAX_LINE_BYTES + 1)
                if frame is not None and frame.complete else b"")
    if not line.endswith(b"\n"):
        raise CorruptionError(f"{path}: no complete header line")
    return line[:-1]


def read_lines(path: str | os.PathLike[str], sink: LineSink) -> LoadResult:
    """Feed ``sink`` the header line and each complete record line of a
    file, under the framing rules (a torn raw tail or torn last frame is not
    fed); a sink with ``tolerates_defects`` may refuse lines in a complete frame."""
    result = LoadResult(source=str(path), compression=compression_of(path))
    with open(path, "rb") as stream:
        read_framed(stream, result.compression, sink, result)
    return result


