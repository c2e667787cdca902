"""Where a store is (``--store``): the one place a location's backend is
decided. A URI's scheme names its backend; anything without a scheme is a
SQLite file's path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from .errors import StoreLocationError

__all__ = ["SCHEMES", "Backend", "store_backend", "store_location"]

Backend = Literal["sqlite", "postgresql"]
#: The URI schemes this build has a backend for.
SCHEMES: dict[str, Backend] = {"postgresql": "postgresql", "postgres": "postgresql"}
#: A URI's scheme (RFC 3986 §3.1) and its ``//``: a path never starts so.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def store_backend(location: Path | str) -> Backend:
    """The backend of ``location``: ``postgresql`` for a URI of one of
    :data:`SCHEMES`, ``sqlite`` for a path; a URI of another scheme is a
    :class:`StoreLocationError` naming the schemes there are."""
    if isinstance(location, Path):
        return "sqlite"
    match = _SCHEME.match(location)
    if match is None:
        return "sqlite"
    backend = SCHEMES.get(match.group(1).lower())
    if backend is None:
        raise StoreLocationError(f"{match.group(0)}…: no store backend of this build takes the scheme "
                                 f"{match.group(1)!r}; a store is a SQLite file's path or a URI of "
                                 f"{', '.join(f'{scheme}://' for scheme in SCHEMES)} (PostgreSQL)")
    return backend


def store_location(given: Path | str) -> Path | str:
    """``given`` as the stores take it: a URI as a string, a path as a
    :class:`~pathlib.Path` (:func:`store_backend` refuses an unknown scheme)."""
    return given if store_backend(given) != "sqlite" else Path(given)
