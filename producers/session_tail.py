"""Reading what was appended to a session file since a position.

The shipper follows every file of a sessions root with it, the headless
worker bridge the one file its dsh process writes. Only complete records
are taken (a raw line without its newline, or a zstd frame still being
written, is waited on, never taken half); the header line is checked
(format version first, then identity against the directory name), every
line must be a storage record and seqs contiguous. A refusal ends the
file's reading after the good records before it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from dsh_core.errors import CorruptionError, DecodeError, DshError, FormatUnsupportedError, SequenceGapError
from dsh_core.folds import read_header
from dsh_core.session_header import SessionHeader
from dsh_core.storage.framing import decompress_frame, iter_frames
from dsh_core.storage.layout import compression_of, encode_segment, generation_of
from dsh_kafka.records import SessionRecord, header_record, record_from_line
from dsh_kafka.topics import MAX_MESSAGE_BYTES

__all__ = ["NewRecords", "Position", "read_new"]

#: Bytes of a raw file read at once (bounded memory): a line longer than a
#: record may be is refused, not waited on.
_READ_LIMIT = MAX_MESSAGE_BYTES + 1


@dataclass
class Position:
    """How far a file has been read (and, for the shipper, why it stopped)."""

    offset: int = 0
    lines: int = 0
    next_seq: int = 0
    session_id: str | None = None
    version: int = 0  # the header's format version
    failed: str | None = None


@dataclass
class NewRecords:
    """Complete records read in one go; ``error`` ends the file's reading
    after the good records before it."""

    records: list[SessionRecord] = field(default_factory=list)
    position: Position = field(default_factory=Position)
    error: DshError | None = None


def _check_header(path: Path, line: bytes) -> SessionHeader:
    generation = generation_of(path)
    header = read_header(line, str(path), generation)
    if generation is not None and path.parent.name != encode_segment(header.id):
        raise CorruptionError(f"{path}: header id {header.id!r} does not belong in directory "
                              f"{path.parent.name!r} (expected {encode_segment(header.id)!r})")
    return header


def read_new(path: Path, start: Position) -> NewRecords:
    """Complete records after ``start``, up to a refusal if there is one."""
    out = NewRecords(position=Position(**start.__dict__))
    try:
        if compression_of(path) == "zstd":
            _read_zstd(path, out)
        else:
            _read_raw(path, out)
    except (CorruptionError, FormatUnsupportedError) as error:
        out.error = error
    return out


def _line_records(path: Path, lines: list[bytes], out: NewRecords) -> None:
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


def _read_raw(path: Path, out: NewRecords) -> None:
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


def _read_zstd(path: Path, out: NewRecords) -> None:
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
