"""Reading what was appended to a session file since a position.

The shipper follows every file of a sessions root with it, the headless
worker bridge the one file its dsh process writes. Only complete records
are taken (a raw line without its newline, or a zstd frame still being
written, is waited on, never taken half); the header line is checked
(format version first, then identity against the directory name), every
line must be a storage record and seqs contiguous. A refusal ends the
file's reading after the good records before it.

Memory stays bounded whatever the file holds: text is read and inflated a
piece at a time (:data:`~dsh_core.storage.framing.READ_SIZE`), a line is
refused once it passes the record limit, and a zstd frame is checked whole
(checksum, size, record boundary) before any of its records is handed out:
its lines are kept from that check when the frame is small, else inflated
again as they are handed out.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from dsh_core.errors import CorruptionError, DecodeError, LayoutError, SequenceGapError
from dsh_core.formats import read_header
from dsh_core.session_header import SessionHeader
from dsh_core.storage.framing import READ_SIZE, Frame, frame_pieces, iter_frames
from dsh_core.storage.layout import LAYOUT, compression_of, encode_segment, generation_of
from dsh_core.storage.lines import LineSplitter
from dsh_core.storage.reader import header_line_from
from dsh_kafka.records import SessionRecord, header_record, record_from_line, writer_of
from dsh_kafka.topics import MAX_MESSAGE_BYTES

__all__ = ["FileMark", "Position", "SessionTail", "open_log"]

#: A frame of up to this much plaintext keeps its lines from the check;
#: a larger one is inflated a second time as its records are handed out.
_HELD_FRAME_BYTES = 4 << 20


#: A file's mark digests this much at its position and at its end.
_MARK_BYTES = 64 << 10


def open_log(path: Path) -> BinaryIO:
    """A session log (``<root>/<project>/<id>/<file>``) opened for reading,
    if it is a regular file: each of its project folder, session folder and
    file opened from the one before, never through a symbolic link, and the
    file never waited on if it is a fifo (any of these may have been put in
    place after the root was read): :class:`CorruptionError` otherwise,
    naming it as the root's scan would."""
    parts = path.parts
    chained = min(3, len(parts) - (1 if path.is_absolute() else 0))  # project folder, session folder, file
    descriptor = os.open(Path(*parts[:len(parts) - chained]) if len(parts) > chained else Path("."),
                         os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts[len(parts) - chained:], 1):
            kind = os.O_NONBLOCK if index == chained else os.O_DIRECTORY
            try:
                opened = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | kind, dir_fd=descriptor)
            except OSError as error:  # a link: ELOOP, or ENOTDIR where a folder was asked for
                if error.errno == errno.ELOOP or error.errno == errno.ENOTDIR and stat.S_ISLNK(
                        os.stat(part, dir_fd=descriptor, follow_symlinks=False).st_mode):
                    raise CorruptionError(f"{Path(*parts[:len(parts) - chained + index])}: a symbolic link; links "
                                          "in a sessions root are not followed") from None
                raise
            os.close(descriptor)
            descriptor = opened
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CorruptionError(f"{path}: not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


@dataclass(frozen=True)
class FileMark:
    """What a file was, to tell later whether it changed: size, modification
    time, inode, and a digest of the bytes at a position (where its reading
    was refused) and of its last bytes (a rewrite within the file system's
    timestamp granularity changes these, not the time)."""

    size: int
    mtime_ns: int
    inode: int
    digest: str

    @classmethod
    def of(cls, path: Path, offset: int) -> "FileMark":
        """The mark of ``path`` now, its digest taken at ``offset``."""
        digest = hashlib.blake2b(digest_size=16)
        with open_log(path) as stream:
            status = os.fstat(stream.fileno())
            for at in (offset, max(0, status.st_size - _MARK_BYTES)):
                stream.seek(at)
                digest.update(stream.read(_MARK_BYTES))
        return cls(status.st_size, status.st_mtime_ns, status.st_ino, digest.hexdigest())


@dataclass
class Position:
    """How far a file has been read (and, for the shipper, why it stopped
    and what the file was then)."""

    offset: int = 0
    lines: int = 0
    next_seq: int = 0
    session_id: str | None = None
    version: int = 0  # the header's format version
    writer: str = ""  # the header's writer (dsh_kafka.records.writer_of); "" in checkpoints from before writers
    failed: str | None = None
    failed_as: FileMark | None = None


class SessionTail:
    """The complete records of one session file after ``start``.

    Iterating yields them in order and raises a refusal after the good
    records before it. :attr:`position` moves past a raw line, or a whole
    zstd frame, once the records after it are asked for (or the iteration
    ends): it covers only records that were handed out, so a consumer that
    stops early resumes from there, at worst repeating the records of one
    frame.
    """

    def __init__(self, path: Path, start: Position) -> None:
        self.path = path
        self.where = str(path)
        self.position = replace(start)

    def __iter__(self) -> Iterator[SessionRecord]:
        with open_log(self.path) as stream:
            if self.position.session_id is not None and not self.position.writer:  # read past it before writers
                self.position.writer = writer_of(read_header(header_line_from(stream, self.path), self.where))
                stream.seek(0)
            if compression_of(self.path) == "zstd":
                yield from self._zstd(stream)
            else:
                yield from self._raw(stream)

    def _raw(self, stream: BinaryIO) -> Iterator[SessionRecord]:
        size = stream.seek(0, os.SEEK_END)
        at = self.position.offset
        if size < at:
            raise CorruptionError(f"{self.where}: file shrank to {size} bytes below the shipped offset {at} "
                                  "(rewritten or repaired after shipping)")
        stream.seek(at)
        splitter = LineSplitter(self.where, self.position.lines, MAX_MESSAGE_BYTES)
        work = replace(self.position)
        while at < size:
            chunk = stream.read(min(READ_SIZE, size - at))
            if not chunk:
                break
            at += len(chunk)
            for line in splitter.feed(chunk):
                record = self._record(line, work)
                work.offset += len(line) + 1
                yield record
                self.position = replace(work)

    def _zstd(self, stream: BinaryIO) -> Iterator[SessionRecord]:
        stream.seek(self.position.offset)
        for frame in iter_frames(stream, self.where):
            if not frame.complete:
                return  # still being written: wait for the whole frame
            work = replace(self.position)
            for line in self._checked_lines(stream, frame):
                yield self._record(line, work)
            work.offset = frame.end
            self.position = work

    def _checked_lines(self, stream: BinaryIO, frame: Frame) -> Iterable[bytes]:
        """The lines of a complete frame, once all of it is known good."""
        splitter = LineSplitter(self.where, self.position.lines, MAX_MESSAGE_BYTES)
        held: list[bytes] | None = []
        inflated = 0
        for piece in frame_pieces(stream, frame, self.where):
            lines = splitter.feed(piece)
            inflated += len(piece)
            if held is not None and inflated <= _HELD_FRAME_BYTES:
                held.extend(lines)
            else:
                held = None
        if not inflated or splitter.fragment:
            raise CorruptionError(f"{self.where}: frame at byte {frame.start} does not end on a record boundary")
        if self.position.session_id is None and splitter.lines != self.position.lines + 1:
            raise CorruptionError(f"{self.where}: first frame is not exactly one header line")
        if held is not None:
            return held
        again = LineSplitter(self.where, self.position.lines, MAX_MESSAGE_BYTES)
        return (line for piece in frame_pieces(stream, frame, self.where) for line in again.feed(piece))

    def _record(self, line: bytes, work: Position) -> SessionRecord:
        """The record of the next line; ``work`` moves past it."""
        work.lines += 1
        if work.session_id is None:
            header = self._header(line)
            record = header_record(header)
            work.session_id, work.version, work.writer = header.id, header.version, record.writer
            return record
        try:
            record = record_from_line(work.session_id, line, work.version, work.writer)
        except DecodeError as error:
            raise CorruptionError(f"{self.where}: line {work.lines}: {error.message} (after seq {work.next_seq - 1})") from None
        if record.seq != work.next_seq:
            raise SequenceGapError(work.session_id, work.next_seq, record.seq, f"{self.where}: line {work.lines}")
        work.next_seq += record.count
        return record

    def _header(self, line: bytes) -> SessionHeader:
        generation = generation_of(self.path)
        header = read_header(line, self.where, generation)
        if generation is not None and self.path.parent.name != encode_segment(header.id):
            raise LayoutError(f"{self.where}: the header's session id {header.id!r} belongs in a folder named "
                              f"{encode_segment(header.id)!r}, not {self.path.parent.name!r}; {LAYOUT}")
        return header
