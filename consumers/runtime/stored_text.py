"""Text as both store backends keep it, exactly.

A log's text may hold characters no store text holds: a lone surrogate
(JSON's ``"\\ud800"``; neither SQLite nor PostgreSQL stores one) and NUL
(PostgreSQL's text holds none). Every string a store writes goes through
:func:`stored_parameters` and every row it reads back through
:func:`read_row`, on both backends, so both keep and answer the same: each
such character, and the escape character itself, is written as the escape
character, its code point in hex and ``;``; all other text is written as
it is. The escape is U+10FFFF, a noncharacter (Unicode reserves those for
a program's internal use, so logs all but never hold it). The mapping is
injective and undone on read; a lookup's parameters go through it too, so
an equality or ``LIKE`` match on stored text answers as on the original.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["ESCAPE", "read_row", "read_text", "stored_parameters", "stored_text"]

ESCAPE = "\U0010ffff"
_UNKEPT = re.compile("[\x00\ud800-\udfff\U0010ffff]")
_ESCAPED = re.compile("\U0010ffff([0-9a-f]{1,6});")


def stored_text(text: str) -> str:
    """``text`` as a store keeps it."""
    if text.isascii():  # O(1): no surrogate, no escape, at most a NUL
        return text.replace("\x00", f"{ESCAPE}0;") if "\x00" in text else text
    return _UNKEPT.sub(lambda match: f"{ESCAPE}{ord(match.group()):x};", text)


def read_text(text: str) -> str:
    """The text a store's ``text`` was written from (:func:`stored_text`)."""
    if ESCAPE not in text:
        return text
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 16)), text)


def stored_parameters(parameters: Sequence[Any]) -> Sequence[Any]:
    """A statement's parameters with every string as a store keeps it
    (the same sequence when none changes, as almost always)."""
    for value in parameters:
        if type(value) is str and not (value.isascii() and "\x00" not in value):
            return [stored_text(value) if type(value) is str else value for value in parameters]
    return parameters


def read_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """A fetched row, as a tuple, with every string as it was written (a
    tuple is returned as it is when nothing in it was escaped)."""
    for value in row:
        if type(value) is str and ESCAPE in value:  # O(1) unless the string holds characters this wide
            return tuple(read_text(value) if type(value) is str else value for value in row)
    return row if type(row) is tuple else tuple(row)
