"""Physical framing of a session file (docs/formats/v0.md §8.4, v0 §8.6 step 1).

``none``: the file is the JSONL text. ``zstd``: concatenated standard
Zstandard frames, each with a content checksum; frame 1 holds exactly the
header line, each later frame one append batch. Frames are located by their
structure (magic, descriptor, block headers), seeking past block contents
without reading them, so a file that ends inside a frame is recognized as
torn, not corrupt, and no frame is ever held whole: its plaintext is
inflated from the file a piece at a time (:func:`frame_pieces`).
"""

from __future__ import annotations

import os
from typing import BinaryIO, Iterator, NamedTuple, cast

import zstandard

from ..errors import CorruptionError

__all__ = ["ZSTD_MAGIC", "FRAME_PLAINTEXT_LIMIT", "READ_SIZE", "Frame", "iter_frames", "frame_pieces",
           "frame_plaintext", "compress_frame"]

ZSTD_MAGIC = 0xFD2FB528
#: Bytes read (raw files) or inflated (zstd frames) at a time.
READ_SIZE = 1 << 20
#: The most plaintext one frame may hold (dsh writes one frame per append
#: batch; a batch of several large tool results stays far below this).
FRAME_PLAINTEXT_LIMIT = 256 << 20

_compressor = zstandard.ZstdCompressor(write_checksum=True)
_decompressor = zstandard.ZstdDecompressor()


class Frame(NamedTuple):
    """One frame's place in the file; ``complete`` is False for a torn tail
    (``size`` is then what the file holds of it)."""

    start: int
    size: int
    complete: bool

    @property
    def end(self) -> int:
        return self.start + self.size


def iter_frames(stream: BinaryIO, where: str) -> Iterator[Frame]:
    """Yield where the frames of a zstd session file are, in order, from
    the stream's position on, reading only frame and block headers. The last
    frame may be incomplete; the file's end is its size when this starts (a
    frame written after that is not seen). Each step seeks to where the last
    one ended, so the stream may be read elsewhere between steps."""
    offset = stream.tell()
    size = stream.seek(0, os.SEEK_END)
    while offset < size:
        start = offset
        stream.seek(offset)

        def take(count: int) -> bytes | None:
            """The next ``count`` header bytes, or None past the file's end."""
            nonlocal offset
            if offset + count > size:
                return None
            chunk = stream.read(count)
            offset += count
            return chunk

        def skip(count: int) -> bool:
            nonlocal offset
            offset += count
            stream.seek(offset)
            return offset <= size

        magic = take(4)
        if magic is None:
            yield Frame(start, size - start, False)
            return
        if int.from_bytes(magic, "little") != ZSTD_MAGIC:
            raise CorruptionError(f"{where}: corrupt Zstandard session log: invalid frame magic at byte {start}")
        head = take(1)
        if head is None:
            yield Frame(start, size - start, False)
            return
        descriptor = head[0]
        if descriptor & 0x18:
            raise CorruptionError(f"{where}: corrupt Zstandard session log: reserved frame-header bit at byte {start + 4}")
        size_flag = descriptor >> 6
        single_segment = bool(descriptor & 0x20)
        has_checksum = bool(descriptor & 0x04)
        dictionary_flag = descriptor & 0x03
        dictionary_bytes = 4 if dictionary_flag == 3 else dictionary_flag
        size_bytes = (1 if single_segment else 0) if size_flag == 0 else 1 << size_flag
        if not skip((0 if single_segment else 1) + dictionary_bytes + size_bytes):
            yield Frame(start, size - start, False)
            return
        while True:
            header_at = offset
            block = take(3)
            if block is None:
                yield Frame(start, size - start, False)
                return
            block_header = int.from_bytes(block, "little")
            block_type = (block_header >> 1) & 3
            if block_type == 3:
                raise CorruptionError(f"{where}: corrupt Zstandard session log: reserved block type at byte {header_at}")
            if not skip(1 if block_type == 1 else block_header >> 3):
                yield Frame(start, size - start, False)
                return
            if block_header & 1:  # the last block
                break
        if has_checksum and not skip(4):
            yield Frame(start, size - start, False)
            return
        yield Frame(start, offset - start, True)


class _Region:
    """The bytes of one frame, read from its file as the decompressor asks."""

    def __init__(self, stream: BinaryIO, frame: Frame) -> None:
        self._stream, self._at, self._left = stream, frame.start, frame.size

    def read(self, count: int = -1) -> bytes:
        count = self._left if count < 0 else min(count, self._left)
        self._stream.seek(self._at)
        data = self._stream.read(count)
        self._at += len(data)
        self._left -= len(data)
        return data


def frame_pieces(stream: BinaryIO, frame: Frame, where: str) -> Iterator[bytes]:
    """The plaintext of one frame, inflated from the file :data:`READ_SIZE`
    bytes at a time. Of a complete frame, a decoding or checksum failure is
    corruption, raised after the pieces before it, and so is inflating past
    :data:`FRAME_PLAINTEXT_LIMIT` (a decompression bomb, refused before it
    takes the memory); of a torn frame, whatever decodes."""
    inflated = 0
    try:
        # zstandard reads any object with read(size); its stub names IO[bytes] alone
        region = cast(BinaryIO, _Region(stream, frame))
        with _decompressor.stream_reader(region, read_across_frames=False) as reader:
            while piece := reader.read(READ_SIZE):
                inflated += len(piece)
                if inflated > FRAME_PLAINTEXT_LIMIT:
                    raise CorruptionError(f"{where}: the Zstandard frame at byte {frame.start} ({frame.size} bytes) "
                                          f"inflates past {FRAME_PLAINTEXT_LIMIT} bytes; refused as a decompression bomb")
                yield piece
    except zstandard.ZstdError as exc:
        if frame.complete:
            raise CorruptionError(f"{where}: corrupt Zstandard session log: {exc} (frame at byte {frame.start})") from None


def frame_plaintext(stream: BinaryIO, frame: Frame, where: str, limit: int) -> bytes:
    """The whole plaintext of a small frame (a header frame), refused as
    corruption past ``limit`` bytes."""
    pieces, size = [], 0
    for piece in frame_pieces(stream, frame, where):
        size += len(piece)
        if size > limit:
            raise CorruptionError(f"{where}: the Zstandard frame at byte {frame.start} holds more than {limit} bytes")
        pieces.append(piece)
    return b"".join(pieces)


def compress_frame(plaintext: bytes) -> bytes:
    """One checksummed frame at the library's default level."""
    return _compressor.compress(plaintext)
