"""Splitting a session file's text into lines, a piece at a time, with a
bounded line: the text is never held whole, and a line longer than the
limit is refused as soon as it passes it, not after it was read."""

from __future__ import annotations

from ..errors import CorruptionError

__all__ = ["MAX_LINE_BYTES", "LineSplitter"]

#: The longest line a session file may hold (the events topic takes records
#: of the same size, ``dsh_kafka.topics.MAX_MESSAGE_BYTES``).
MAX_LINE_BYTES = 16 << 20


class LineSplitter:
    """Complete lines of text fed in pieces; :attr:`fragment` is the text
    after the last newline. ``lines`` counts the lines so far (start it at
    the lines before the first piece, for the messages' line numbers)."""

    def __init__(self, where: str, lines: int = 0, limit: int = MAX_LINE_BYTES) -> None:
        self.where = where
        self.lines = lines
        self.limit = limit
        self._fragment = bytearray()

    @property
    def fragment(self) -> bytes:
        return bytes(self._fragment)

    def feed(self, piece: bytes) -> list[bytes]:
        """The lines ``piece`` completes (without their newlines)."""
        parts = piece.split(b"\n")
        if len(parts) == 1:
            self._fragment += piece
            self._check(len(self._fragment), 1)
            return []
        if self._fragment:
            self._fragment += parts[0]
            parts[0] = bytes(self._fragment)
        self._fragment = bytearray(parts.pop())
        self._check(len(parts[0]), 1)
        self._check(len(self._fragment), len(parts) + 1)
        self.lines += len(parts)
        return parts

    def _check(self, size: int, nth: int) -> None:
        if size > self.limit:
            raise CorruptionError(f"{self.where}: line {self.lines + nth} is longer than the {self.limit}-byte "
                                  "record limit")
