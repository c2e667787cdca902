"""Reading the view store from a command: the store opened read-only for
the command's length (:func:`reader_of`), and the one session a given id or
id prefix names (:func:`resolve_session`). The reading commands and the
store commands (redrive, delete, export) share these."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from dsh_core.errors import PipelineError

__all__ = ["reader_of", "resolve_session"]


@contextlib.contextmanager
def reader_of(location: str) -> Iterator[Any]:
    """The store at ``location`` opened read-only, closed after."""
    from consumers.projector.store_reader import StoreReader
    reader = StoreReader(location)
    try:
        yield reader
    finally:
        reader.close()


def resolve_session(reader: Any, given: str) -> str:
    """The one session ``given`` names: its id, or a prefix of exactly one id."""
    if reader.session_exists(given):
        return given
    found = reader.resolve(given)
    if len(found) == 1:
        return found[0]
    if not found:
        raise PipelineError(f"no session {given!r} in {reader.where} (neither an id nor the start of one)")
    raise PipelineError(f"{given!r} starts {'more than ' if len(found) == 10 else ''}{len(found)} session ids in "
                        f"{reader.where}: {', '.join(found[:5])}{', ...' if len(found) > 5 else ''}; give more of it")
