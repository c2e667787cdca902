"""The shipper: follows a dsh sessions root and ships every session's records.

* Discovery: ``<root>/<project>/<session>/session[.vN].jsonl[.zstd]`` (dsh's
  layout; of a session dsh migrated, the newest generation). Every format
  this build reads is shipped as stored; records carry the header's
  version in ``dsh-format``.
* Tailing: a session file is read from its checkpointed byte offset; only
  complete records are shipped (a raw line without its newline, or a zstd
  frame still being written, is waited on, never shipped half).
* Checking: the header line (format version first, then identity against
  the directory name), every line a storage record, seqs contiguous. A
  failing file is reported once (named error, path, line, seq) and stops
  shipping; every other session keeps going.
* Durability: after each pass the publisher is flushed (broker acks) and
  only then the checkpoints file is replaced atomically (write, fsync,
  rename). A crash — even ``kill -9`` — resumes from the last checkpoint, so
  a record is never lost; re-shipped records are exact repeats (same key,
  same seq, same bytes) that consumers drop by seq.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from prometheus_client import Counter, Gauge

from dsh_core.errors import (CorruptionError, DecodeError, DshError, FormatUnsupportedError, PipelineError,
                             SequenceGapError, StateStoreError)
from dsh_kafka.records import SessionRecord, header_record, record_from_line
from dsh_kafka.topics import MAX_MESSAGE_BYTES
from dsh_core.folds import read_header
from dsh_core.session_header import SessionHeader
from dsh_core.storage.framing import decompress_frame, iter_frames
from dsh_core.storage.layout import compression_of, encode_segment, find_session_files, generation_of

__all__ = ["ShipperConfig", "Shipper", "Checkpoints", "check_root"]

SHIPPED_RECORDS = Counter("dsh_shipper_records_total", "Records shipped, by kind.", ["kind"])
SHIPPED_EVENTS = Counter("dsh_shipper_events_total", "Session events shipped.")
SHIPPER_ERRORS = Counter("dsh_shipper_errors_total", "Session files and directories refused, by error class.", ["error"])
SESSIONS = Gauge("dsh_shipper_sessions", "Session files followed, by state.", ["state"])

#: Bytes of a raw file read at once (bounded memory): a line longer than a
#: record may be is refused, not waited on.
_READ_LIMIT = MAX_MESSAGE_BYTES + 1


@dataclass
class _Position:
    """Where shipping of one file stands."""

    offset: int = 0
    lines: int = 0
    next_seq: int = 0
    session_id: str | None = None
    version: int = 0  # the header's format version
    failed: str | None = None


class Checkpoints:
    """The per-file positions, persisted atomically. A file that cannot be
    read or written is a :class:`StateStoreError` naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.positions: dict[str, _Position] = {}
        try:
            if path.exists():
                raw = json.loads(path.read_text("utf-8"))
                self.positions = {name: _Position(**entry) for name, entry in raw["files"].items()}
        except OSError as error:
            raise StateStoreError(f"{path}: cannot read the shipper's checkpoints: {error.strerror or error}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise StateStoreError(f"{path}: not a shipper checkpoint file ({type(error).__name__}: {error}); move it "
                                  "away to ship the root again from the start (consumers skip the repeats)") from None

    def save(self) -> None:
        temp = self.path.with_suffix(".tmp")
        payload = {"files": {name: position.__dict__ for name, position in sorted(self.positions.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "w", encoding="utf-8") as stream:
                json.dump(payload, stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temp, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            raise StateStoreError(f"{self.path}: cannot write the shipper's checkpoints: "
                                  f"{error.strerror or error}") from None


@dataclass(frozen=True)
class ShipperConfig:
    root: Path
    state_dir: Path
    poll_seconds: float = 0.5
    once: bool = False


@dataclass
class _Read:
    """Complete records read in one go; ``error`` ends the file's shipping
    after the good records before it."""

    records: list[SessionRecord] = field(default_factory=list)
    position: _Position = field(default_factory=_Position)
    error: DshError | None = None


def _check_header(path: Path, line: bytes) -> SessionHeader:
    generation = generation_of(path)
    header = read_header(line, str(path), generation)
    if generation is not None and path.parent.name != encode_segment(header.id):
        raise CorruptionError(f"{path}: header id {header.id!r} does not belong in directory "
                              f"{path.parent.name!r} (expected {encode_segment(header.id)!r})")
    return header


def _read_new(path: Path, start: _Position) -> _Read:
    """Complete records after ``start``, up to a refusal if there is one."""
    out = _Read(position=_Position(**start.__dict__))
    try:
        if compression_of(path) == "zstd":
            _read_zstd(path, out)
        else:
            _read_raw(path, out)
    except (CorruptionError, FormatUnsupportedError) as error:
        out.error = error
    return out


def _line_records(path: Path, lines: list[bytes], out: _Read) -> None:
    position = out.position
    for line in lines:
        position.lines += 1
        number = position.lines
        if position.session_id is None:
            header = _check_header(path, line)
            position.session_id, position.version = header.id, header.version
            out.records.append(header_record(header))
            continue
        try:
            record = record_from_line(position.session_id, line, position.version)
        except DecodeError as error:
            raise CorruptionError(f"{path}: line {number}: {error.message} (after seq {position.next_seq - 1})") from None
        if record.seq != position.next_seq:
            raise SequenceGapError(position.session_id, position.next_seq, record.seq, f"{path}: line {number}")
        position.next_seq += record.count
        out.records.append(record)


def _read_raw(path: Path, out: _Read) -> None:
    with open(path, "rb") as stream:
        size = stream.seek(0, os.SEEK_END)
        if size < out.position.offset:
            raise CorruptionError(f"{path}: file shrank to {size} bytes below the shipped offset "
                                  f"{out.position.offset} (rewritten or repaired after shipping)")
        stream.seek(out.position.offset)
        data = stream.read(_READ_LIMIT)
    end = data.rfind(b"\n")
    if end < 0:
        if len(data) == _READ_LIMIT:
            raise CorruptionError(f"{path}: line {out.position.lines + 1} is longer than the {MAX_MESSAGE_BYTES}-byte "
                                  "record limit")
        return  # nothing complete yet: a torn record is waited on
    for line in data[:end].split(b"\n"):
        _line_records(path, [line], out)
        out.position.offset += len(line) + 1


def _read_zstd(path: Path, out: _Read) -> None:
    taken = 0  # plaintext bytes: past _READ_LIMIT the records go out before more frames are read
    with open(path, "rb") as stream:
        stream.seek(out.position.offset)
        for frame in iter_frames(stream, str(path)):
            if not frame.complete:
                return  # still being written: wait for the whole frame
            plaintext = decompress_frame(frame.data, str(path))
            if not plaintext.endswith(b"\n"):
                raise CorruptionError(f"{path}: frame at byte {out.position.offset + frame.start} does not end on a "
                                      "record boundary")
            if out.position.session_id is None and plaintext.count(b"\n") != 1:
                raise CorruptionError(f"{path}: first frame is not exactly one header line")
            _line_records(path, plaintext[:-1].split(b"\n"), out)
            out.position.offset += len(frame.data)
            taken += len(plaintext)
            if taken >= _READ_LIMIT:
                return


def check_root(root: Path) -> None:
    """Raise :class:`PipelineError` unless ``root`` is a directory to ship."""
    if not root.is_dir():
        raise PipelineError(f"{root}: the sessions root " + ("is not a directory" if root.exists() else
                                                             "does not exist"))


class Shipper:
    """Ships a sessions root through ``send`` (e.g. :meth:`Publisher.send`)."""

    def __init__(self, config: ShipperConfig, send: Callable[[SessionRecord], Any], flush: Callable[[], Any],
                 report: Callable[[str], None]) -> None:
        check_root(config.root)
        self.config = config
        self._send = send
        self._flush = flush
        self._report = report
        self.checkpoints = Checkpoints(config.state_dir / "shipper-checkpoints.json")
        self._reported: set[str] = set()

    async def ship_once(self) -> int:
        """One pass over the root; returns the number of records shipped."""
        shipped = 0
        moved: dict[str, _Position] = {}
        files = find_session_files(self.config.root, self._refuse_entry)
        for path in files:
            name = str(path.relative_to(self.config.root))
            position = self.checkpoints.positions.get(name, _Position())
            if position.failed:
                if name not in self._reported:  # refused before this process: say so once again
                    self._reported.add(name)
                    self._report(f"refused earlier, not shipped: {position.failed}")
                continue
            while True:
                try:
                    read = _read_new(path, position)
                except OSError as error:  # unreadable now (permissions, replaced): said once, tried again next pass
                    self._refuse_entry(CorruptionError(f"{path}: cannot be read: {error.strerror or error}"))
                    break
                for record in read.records:
                    await self._send(record)
                    SHIPPED_RECORDS.labels(record.kind).inc()
                    SHIPPED_EVENTS.inc(record.count)
                shipped += len(read.records)
                if read.error is not None:
                    self._reported.add(name)
                    SHIPPER_ERRORS.labels(type(read.error).__name__).inc()
                    self._report(f"refused {type(read.error).__name__}: {read.error.message}")
                    moved[name] = _Position(**{**read.position.__dict__, "failed": read.error.message})
                    break
                if read.position.offset == position.offset:
                    break
                position = read.position
                moved[name] = position
        if moved:
            await self._flush()  # broker acks first, then the checkpoint
            self.checkpoints.positions.update(moved)
            self.checkpoints.save()
        states = [p for p in self.checkpoints.positions.values()]
        SESSIONS.labels("shipping").set(sum(1 for p in states if not p.failed))
        SESSIONS.labels("refused").set(sum(1 for p in states if p.failed))
        return shipped

    def _refuse_entry(self, error: DshError) -> None:
        if error.message not in self._reported:  # said once per process, like a refused file
            self._reported.add(error.message)
            SHIPPER_ERRORS.labels(type(error).__name__).inc()
            self._report(f"refused {type(error).__name__}: {error.message}")

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the root until ``stop`` is set (``once``: one pass)."""
        while True:
            await self.ship_once()
            if self.config.once or stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), self.config.poll_seconds)
            except asyncio.TimeoutError:
                pass
