"""The view store's backends, and the one place a location's backend is
decided (:func:`backend_of`).

A backend opens a store's tables for writing (:meth:`Backend.open`) and
an existing store for reading (:meth:`Backend.open_reading`); the store
classes above it (:class:`~consumers.projector.store.ViewStore`,
:class:`~consumers.projector.store_reader.StoreReader`) write their
statements once for all of them. :data:`BACKENDS` is every backend this
build has: a URI's scheme names one of them, anything without a scheme
is a SQLite file's path, any other scheme is a
:class:`~consumers.runtime.errors.StoreLocationError`.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path
from typing import Any, ContextManager, Protocol, Sequence

import psycopg

from .database import Database, Migrations, SqliteReading, memory_uri
from .errors import StateStoreError, StoreLocationError
from .postgres import PostgresDatabase, PostgresReading, display_location

__all__ = ["BACKENDS", "Backend", "MEMORY", "MemoryBackend", "POSTGRESQL", "SCHEMES", "SQLITE", "StoreDatabase",
           "StoreReading", "backend_of", "store_location"]

Location = Path | str


class StoreDatabase(Protocol):
    """A store's tables of one kind and layout, open for writing."""

    where: str
    kind: str
    connection: Any

    def transaction(self) -> ContextManager[Any]: ...

    def close(self) -> None: ...


class StoreReading(Protocol):
    """An existing store, open for reading only."""

    where: str

    def rows(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """One kind of view store."""

    #: The backend's name (``sqlite``, ``postgresql``, ``memory``).
    name: str
    #: The URI schemes naming it (none: a path names it).
    schemes: tuple[str, ...]
    #: What a driver raises for a row refused for what it holds (a number
    #: beyond a 64-bit column, a constraint), not for the store.
    rows_refused: tuple[type[BaseException], ...]
    #: Whether other processes see the store (the readers, ``serve``, more
    #: projectors), not only the process that opened it.
    shared: bool

    def where(self, location: Location) -> str:
        """``location`` as messages show it (no password)."""
        ...

    def open(self, location: Location, kind: str, layout: int, schema: Sequence[str],
             migrations: Migrations) -> StoreDatabase:
        """The store at ``location``, created in ``layout`` if empty,
        migrated if older, refused if of another kind."""
        ...

    def open_reading(self, location: Location) -> StoreReading:
        """The existing store at ``location``, read-only (never created)."""
        ...


class SqliteBackend:
    """A SQLite file (WAL): the embedded default, one host."""

    name = "sqlite"
    schemes: tuple[str, ...] = ()
    rows_refused: tuple[type[BaseException], ...] = (OverflowError, sqlite3.IntegrityError, sqlite3.DataError)
    shared = True

    def where(self, location: Location) -> str:
        return str(location)

    def open(self, location: Location, kind: str, layout: int, schema: Sequence[str],
             migrations: Migrations) -> StoreDatabase:
        return Database(Path(location), kind, layout, schema, migrations)

    def open_reading(self, location: Location) -> StoreReading:
        path = Path(location)
        if not path.is_file():
            raise StateStoreError(f"{path}: no view store there (the projector's --store)")
        return SqliteReading(f"{path.resolve().as_uri()}?mode=ro", str(path))


class PostgresBackend:
    """A PostgreSQL database: projectors on many hosts in one group."""

    name = "postgresql"
    schemes: tuple[str, ...] = ("postgresql", "postgres")
    rows_refused: tuple[type[BaseException], ...] = (OverflowError, psycopg.DataError, psycopg.IntegrityError)
    shared = True

    def where(self, location: Location) -> str:
        return display_location(str(location))

    def open(self, location: Location, kind: str, layout: int, schema: Sequence[str],
             migrations: Migrations) -> StoreDatabase:
        return PostgresDatabase(str(location), kind, layout, schema, migrations)

    def open_reading(self, location: Location) -> StoreReading:
        return PostgresReading(str(location))


class MemoryBackend:
    """Stores in this process's memory (``memory://NAME``), for tests and
    quick trials: the same SQL and contract as the SQLite file, with no
    file and no server. Every open of one name in a process is the same
    store, kept until :meth:`discard` or the process ends; other processes
    cannot see it (a reader elsewhere finds no store there). A writer
    holds readers off for its transaction (SQLite's in-memory locking)."""

    name = "memory"
    schemes: tuple[str, ...] = ("memory",)
    rows_refused: tuple[type[BaseException], ...] = SqliteBackend.rows_refused
    shared = False

    def __init__(self) -> None:
        self._kept: dict[str, sqlite3.Connection] = {}  # one connection per store, keeping it alive
        self._lock = threading.Lock()

    def where(self, location: Location) -> str:
        return f"memory://{_memory_name(location)}"

    def open(self, location: Location, kind: str, layout: int, schema: Sequence[str],
             migrations: Migrations) -> StoreDatabase:
        name = _memory_name(location)
        with self._lock:
            if name not in self._kept:
                self._kept[name] = sqlite3.connect(memory_uri(name), uri=True, check_same_thread=False)
        return Database(None, kind, layout, schema, migrations, memory=name)

    def open_reading(self, location: Location) -> StoreReading:
        name = _memory_name(location)
        if name not in self._kept:
            raise StateStoreError(f"memory://{name}: no view store there (a memory:// store is seen only by the "
                                  "process that made it)")
        return SqliteReading(memory_uri(name, read_only=True), f"memory://{name}")

    def discard(self, location: Location) -> None:
        """Forget the store at ``location`` (gone once its last user closes it)."""
        with self._lock:
            kept = self._kept.pop(_memory_name(location), None)
        if kept is not None:
            kept.close()


def _memory_name(location: Location) -> str:
    name = str(location).split("://", 1)[1]
    if not name:
        raise StoreLocationError(f"{location}: a memory:// store needs a name (memory://NAME)")
    return name


SQLITE, POSTGRESQL, MEMORY = SqliteBackend(), PostgresBackend(), MemoryBackend()
#: Every view-store backend of this build.
BACKENDS: tuple[Backend, ...] = (SQLITE, POSTGRESQL, MEMORY)
#: The URI schemes this build has a backend for.
SCHEMES: dict[str, Backend] = {scheme: backend for backend in BACKENDS for scheme in backend.schemes}
_SCHEMES_SAID = ", ".join(f"{scheme}://" for scheme in list(SCHEMES)[:-1]) + f" or {list(SCHEMES)[-1]}://"
#: A URI's scheme (RFC 3986 §3.1) and its ``//``: a path never starts so.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def backend_of(location: Location) -> Backend:
    """The backend of ``location``: the one of its URI scheme, SQLite for
    a path; a URI of another scheme is a :class:`StoreLocationError`
    naming the schemes there are."""
    if isinstance(location, Path):
        return SQLITE
    match = _SCHEME.match(location)
    if match is None:
        return SQLITE
    backend = SCHEMES.get(match.group(1).lower())
    if backend is None:
        raise StoreLocationError(f"{match.group(0)}…: no store backend of this build takes the scheme "
                                 f"{match.group(1)!r}; a store is a SQLite file's path or a URI of {_SCHEMES_SAID}")
    return backend


def store_location(given: Location) -> Location:
    """``given`` as the stores take it: a URI as a string, a path as a
    :class:`~pathlib.Path` (:func:`backend_of` refuses an unknown scheme)."""
    return given if backend_of(given) is not SQLITE else Path(given)
