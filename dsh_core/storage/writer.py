"""Writing session files in dsh's format (docs/formats/v0.md §8.4, v0 §8.5, v0 §8.8 commit).

A file is created by its first batch: header and batch go to a temp file,
which is fsynced and published with a hard link (never overwriting an
existing log), then the directory is fsynced. Later batches append one zstd
frame (or their lines) and fsync; a failed append truncates the file back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

from ..errors import EnvelopeError, PipelineError
from ..events import Event
from ..session_header import SessionHeader
from ..shapes import check_retired
from .framing import compress_frame
from .layout import Compression
from .reader import LoadResult
from .records import encode_records

__all__ = ["encode_batch", "SessionFileWriter", "commit_repair", "create_file", "replace_file"]


def _as_dict(event: Event | dict[str, Any]) -> dict[str, Any]:
    return event.to_dict() if isinstance(event, Event) else event


def encode_batch(events: Iterable[Event | dict[str, Any]], compression: Compression, pack: bool = True) -> bytes:
    """The bytes one append batch adds: its JSONL lines, or one zstd frame of them."""
    text = encode_records([_as_dict(e) for e in events], pack=pack)
    return compress_frame(text) if compression == "zstd" else text


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(path: Path, write: Callable[[BinaryIO], object], place: Callable[[Path, Path], None]) -> None:
    """Fill a temp file beside ``path`` with ``write``, fsync it, ``place``
    it at ``path`` (link or replace), then fsync the directory."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        place(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def create_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Publish a new file whole: ``write`` fills it, and it is hard-linked
    in place (an existing file is never replaced: :class:`FileExistsError`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _publish(path, write, os.link)


def replace_file(path: Path, data: bytes) -> None:
    """Write a whole file durably in one step, replacing what is there
    (readers see the old file or the new one, never a part)."""
    _publish(path, lambda stream: stream.write(data), os.replace)


class SessionFileWriter:
    """The one writer of a session file; appends whole batches durably.

    Of a new file (``created`` False, as with ``next_seq == 0`` by default)
    the first batch, or :meth:`create_empty`, creates the file (refusing to
    replace an existing log); otherwise batches append to the existing file,
    whose stored next seq the caller knows (e.g. from a load).
    """

    def __init__(self, path: str | os.PathLike[str], header: SessionHeader, compression: Compression,
                 next_seq: int = 0, pack: bool = True, created: bool | None = None) -> None:
        self.path = Path(path)
        self.header = header
        self.compression = compression
        self.next_seq = next_seq
        self.pack = pack
        self.created = next_seq > 0 if created is None else created

    def create_empty(self) -> None:
        """Create the file with its header alone, as dsh keeps a session
        made durable before its first event (a no-op once it exists)."""
        if not self.created:
            self._create(b"")

    def append(self, events: list[Event | dict[str, Any]]) -> None:
        """Append one batch (a no-op when empty). It must start at the next
        seq and holds no retired event types; unknown types are written."""
        if not events:
            return
        batch = [_as_dict(e) for e in events]
        for event in batch:
            check_retired(event.get("type"), event.get("data"), f"{self.path}: seq {event.get('seq')}")
        self.append_lines(encode_records(batch, pack=self.pack).splitlines(), batch[0].get("seq"),
                          batch[-1]["seq"] + 1)

    def append_lines(self, lines: list[bytes], first_seq: Any, next_seq: int) -> None:
        """Append storage lines exactly as given (one batch, one frame);
        they hold seqs ``first_seq`` up to ``next_seq - 1``."""
        if first_seq != self.next_seq:
            raise EnvelopeError(f"{self.path}: append seq mismatch: batch starts at {first_seq!r}, expected {self.next_seq}")
        text = b"".join(line + b"\n" for line in lines)
        payload = compress_frame(text) if self.compression == "zstd" else text
        if not self.created:  # dsh's first append creates the file
            self._create(payload)
        else:
            self._append_bytes(payload)
        self.next_seq = next_seq

    def _create(self, payload: bytes) -> None:
        header = self.header.to_line() + b"\n"
        head = compress_frame(header) if self.compression == "zstd" else header
        try:
            create_file(self.path, lambda stream: stream.write(head + payload))
        except FileExistsError:
            raise PipelineError(f"{self.path}: a session log already exists; refusing to overwrite it") from None
        self.created = True

    def _append_bytes(self, payload: bytes) -> None:
        with open(self.path, "r+b") as stream:
            size = stream.seek(0, os.SEEK_END)
            try:
                stream.write(payload)
                stream.flush()
                os.fsync(stream.fileno())
            except BaseException:
                stream.truncate(size)
                raise


def commit_repair(path: str | os.PathLike[str], result: LoadResult) -> None:
    """Make a load's crash repair durable: truncate the torn or dropped tail,
    then append the recovered records (zstd) and the closers as one batch."""
    if not result.repaired:
        return
    records = b"".join(line + b"\n" for line in result.recovered_lines)
    closers = encode_records(result.closers, pack=False)
    with open(path, "r+b") as stream:
        stream.truncate(result.committed_bytes)
        stream.seek(result.committed_bytes)
        text = records + closers
        if text:
            stream.write(compress_frame(text) if result.compression == "zstd" else text)
        stream.flush()
        os.fsync(stream.fileno())
