"""Physical framing of a session file (spec §8.4, §8.6 step 1).

``none``: the file is the JSONL text. ``zstd``: concatenated standard
Zstandard frames, each with a content checksum; frame 1 holds exactly the
header line, each later frame one append batch. Frames are located by their
structure (magic, descriptor, block headers) without decompressing, so a
file that ends inside a frame is recognized as torn, not corrupt.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator, NamedTuple

import zstandard

from ..errors import CorruptionError

__all__ = ["ZSTD_MAGIC", "Frame", "iter_frames", "decompress_frame", "decompress_prefix", "compress_frame",
           "READ_SIZE"]

ZSTD_MAGIC = 0xFD2FB528
READ_SIZE = 1 << 20
#: The most plaintext one frame may hold (dsh writes one frame per append
#: batch; a batch of several large tool results stays far below this).
FRAME_PLAINTEXT_LIMIT = 256 << 20
#: Plaintext bytes decompressed at a time.
_INFLATE_PIECE = 1 << 20

_compressor = zstandard.ZstdCompressor(write_checksum=True)
_decompressor = zstandard.ZstdDecompressor()


class Frame(NamedTuple):
    """One frame's bytes at ``start``; ``complete`` is False for a torn tail."""

    start: int
    data: bytes
    complete: bool


def iter_frames(stream: BinaryIO, where: str) -> Iterator[Frame]:
    """Yield the frames of a zstd session file in order, reading only one
    frame into memory at a time. The last frame may be incomplete."""
    offset = 0
    while True:
        start = offset
        buffer = bytearray()

        def take(count: int) -> bool:
            nonlocal offset
            chunk = stream.read(count)
            buffer.extend(chunk)
            offset += len(chunk)
            return len(chunk) == count

        magic = stream.read(4)
        if not magic:
            return
        buffer.extend(magic)
        offset += len(magic)
        if len(magic) < 4:
            yield Frame(start, bytes(buffer), False)
            return
        if int.from_bytes(magic, "little") != ZSTD_MAGIC:
            raise CorruptionError(f"{where}: corrupt Zstandard session log: invalid frame magic at byte {start}")
        if not take(1):
            yield Frame(start, bytes(buffer), False)
            return
        descriptor = buffer[4]
        if descriptor & 0x18:
            raise CorruptionError(f"{where}: corrupt Zstandard session log: reserved frame-header bit at byte {start + 4}")
        size_flag = descriptor >> 6
        single_segment = bool(descriptor & 0x20)
        has_checksum = bool(descriptor & 0x04)
        dictionary_flag = descriptor & 0x03
        dictionary_bytes = 4 if dictionary_flag == 3 else dictionary_flag
        size_bytes = (1 if single_segment else 0) if size_flag == 0 else 1 << size_flag
        if not take((0 if single_segment else 1) + dictionary_bytes + size_bytes):
            yield Frame(start, bytes(buffer), False)
            return
        while True:
            header_at = offset
            if not take(3):
                yield Frame(start, bytes(buffer), False)
                return
            block_header = int.from_bytes(buffer[-3:], "little")
            last_block = block_header & 1
            block_type = (block_header >> 1) & 3
            if block_type == 3:
                raise CorruptionError(f"{where}: corrupt Zstandard session log: reserved block type at byte {header_at}")
            if not take(1 if block_type == 1 else block_header >> 3):
                yield Frame(start, bytes(buffer), False)
                return
            if last_block:
                break
        if has_checksum and not take(4):
            yield Frame(start, bytes(buffer), False)
            return
        yield Frame(start, bytes(buffer), True)


def decompress_frame(frame: bytes, where: str) -> bytes:
    """Plaintext of one complete frame; a checksum or decoding failure is
    corruption, and so is a frame that inflates past :data:`FRAME_PLAINTEXT_LIMIT`."""
    try:
        return _inflate(frame, where)
    except zstandard.ZstdError as exc:
        raise CorruptionError(f"{where}: corrupt Zstandard session log: {exc}") from None


def decompress_prefix(frame: bytes, where: str) -> bytes:
    """Whatever plaintext an incomplete final frame yields (maybe nothing)."""
    try:
        return _inflate(frame, where)
    except zstandard.ZstdError:
        return b""


def _inflate(frame: bytes, where: str) -> bytes:
    """Decompress in bounded pieces, so a frame inflating past the limit is
    refused before it takes the memory."""
    pieces, size = [], 0
    with _decompressor.stream_reader(frame) as reader:
        while piece := reader.read(_INFLATE_PIECE):
            size += len(piece)
            if size > FRAME_PLAINTEXT_LIMIT:
                raise CorruptionError(f"{where}: a Zstandard frame of {len(frame)} bytes inflates past "
                                      f"{FRAME_PLAINTEXT_LIMIT} bytes; refused as a decompression bomb")
            pieces.append(piece)
    return b"".join(pieces)


def compress_frame(plaintext: bytes) -> bytes:
    """One checksummed frame at the library's default level."""
    return _compressor.compress(plaintext)
