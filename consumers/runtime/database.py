"""The SQLite files of the consumer services: one writer each, WAL, a
recorded kind and layout version, one way to run a transaction.

A file holds its kind (``view-store``, ``auditor-state``, ...) and layout
version in a ``dsh_layout`` table; a service refuses a file of another
kind or layout, naming the path and both, instead of reading it wrongly.
Text is kept as :mod:`.stored_text` writes it (exactly, lone surrogates
included). A write the file cannot take (a full disk, an I/O error, a
lock never released) is a :class:`StateStoreError` naming the path.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence
from urllib.parse import quote

from dsh_core.errors import DshError

from .errors import StateStoreError
from .sequencing import AppliedDigest, HeldChanges, HeldRow
from .stored_text import read_row, stored_parameters

__all__ = ["Connection", "Database", "DIGESTS_SCHEMA", "HELD_SCHEMA", "Migrations", "SqliteReading", "applied_digest",
           "claim_layout", "load_held", "memory_uri", "replace_held", "store_digests", "store_held"]

#: How a store's layout ``v`` becomes ``v + 1``, by ``v`` (run inside the claiming transaction).
Migrations = Mapping[int, Callable[[Any], None]]

#: Records a service holds at a gap, by session (every service's store has it).
HELD_SCHEMA = ("CREATE TABLE held (session_id TEXT NOT NULL, seq INTEGER NOT NULL, value BLOB NOT NULL, "
               "count INTEGER NOT NULL, PRIMARY KEY (session_id, seq))")
#: The sha256 of every record applied, by session and first seq (so is every service's).
DIGESTS_SCHEMA = ("CREATE TABLE applied (session_id TEXT NOT NULL, seq INTEGER NOT NULL, count INTEGER NOT NULL, "
                  "digest BLOB NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID")

#: SQLite's primary result codes for a file that cannot take a write.
_UNWRITABLE = frozenset({sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
                         sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CANTOPEN})

#: How a service's state is rebuilt when its file cannot be used.
_REBUILD = ("give the service a path of its own; to rebuild from the topic, move the file away (the auditor replays "
            "by itself; the projector and archiver need a new --group or their group's offsets reset to the earliest)")


def claim_layout(db: Any, where: str, kind: str, layout: int, schema: Sequence[str], migrations: Migrations,
                 tables: set[str]) -> None:
    """Create the layout in an empty store, migrate an older layout of the
    same kind step by step, refuse anything else (inside a transaction)."""
    if not tables:
        db.execute("CREATE TABLE dsh_layout (kind TEXT NOT NULL, version INTEGER NOT NULL)")
        db.execute("INSERT INTO dsh_layout VALUES (?, ?)", (kind, layout))
        for statement in schema:
            db.execute(statement)
        return
    found = db.execute("SELECT kind, version FROM dsh_layout").fetchone() if "dsh_layout" in tables else None
    if found is None:
        raise StateStoreError(f"{where}: no layout record, so not the {kind!r} store in layout {layout} this service "
                              f"writes; {_REBUILD}")
    found_kind, version = found
    if found_kind == kind and version < layout and all(step in migrations for step in range(version, layout)):
        for step in range(version, layout):
            try:
                migrations[step](db)
            except DshError as error:  # stored state the migration cannot read
                raise StateStoreError(f"{where}: migrating the {kind!r} store from layout {step} to {step + 1}: "
                                      f"{error.message}; {_REBUILD}") from None
        db.execute("UPDATE dsh_layout SET version = ?", (layout,))
        return
    if (found_kind, version) != (kind, layout):
        raise StateStoreError(f"{where}: a {found_kind!r} store in layout {version}, not the {kind!r} store in layout "
                              f"{layout} this service writes; {_REBUILD}")


class Connection(Protocol):
    """What the stores' statements ask of a connection: SQLite's, or the
    PostgreSQL adapter's (:class:`~.postgres.PostgresDatabase`)."""

    def execute(self, statement: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]], /) -> Any: ...


class _TextConnection(sqlite3.Connection):
    """A connection whose statements write strings as :mod:`.stored_text`
    keeps them (its ``row_factory`` reads them back)."""

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> sqlite3.Cursor:  # type: ignore[override]
        return super().execute(statement, stored_parameters(parameters))

    def executemany(self, statement: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:  # type: ignore[override]
        return super().executemany(statement, (stored_parameters(row) for row in rows))


def _read_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> tuple[Any, ...]:
    return read_row(row)


def memory_uri(name: str, read_only: bool = False) -> str:
    """The SQLite URI of the in-memory database ``name``: one database for
    every connection of this process that opens it (SQLite's ``memdb``
    VFS), gone when the last of them closes."""
    return f"file:/{quote(name, safe='')}?vfs=memdb" + ("&mode=ro" if read_only else "")


class Database:
    """A service's SQLite file (``None``: a private in-memory database) of
    one kind and layout; with ``path`` ``None``, ``memory`` names a shared
    in-memory database instead (:func:`memory_uri`, shown as
    ``memory://NAME``)."""

    def __init__(self, path: Path | None, kind: str, layout: int, schema: Sequence[str],
                 migrations: Migrations | None = None, *, memory: str | None = None) -> None:
        self.where = str(path) if path is not None else f"memory://{memory}" if memory is not None else ":memory:"
        self.kind = kind
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise StateStoreError(f"{path}: cannot create its folder: {error.strerror or error}") from None
        target = memory_uri(memory) if memory is not None and path is None else self.where
        try:
            self.connection = sqlite3.connect(target, isolation_level=None, check_same_thread=False,
                                              factory=_TextConnection, uri=target != self.where)
        except sqlite3.Error as error:
            raise StateStoreError(f"{self.where}: cannot open the {kind} file: {error}") from None
        self.connection.row_factory = _read_row
        try:
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=NORMAL")
            self._claim(layout, schema, migrations or {})
        except sqlite3.Error as error:  # locked by a writer that keeps it, not a database, unreadable
            self.connection.close()
            raise StateStoreError(f"{self.where}: cannot use the {kind} file: {error}") from None
        except BaseException:
            self.connection.close()
            raise

    def _claim(self, layout: int, schema: Sequence[str], migrations: Migrations) -> None:
        with self.transaction() as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            claim_layout(db, self.where, self.kind, layout, schema, migrations, tables)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; ``ROLLBACK`` on any failure
        (unless SQLite rolled back by itself, as it does when the disk is
        full). A write the file cannot take is a :class:`StateStoreError`."""
        db = self.connection
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode == sqlite3.SQLITE_FULL:
                raise StateStoreError(f"{self.where}: the disk holding the {self.kind} file is full; nothing of "
                                      "this transaction was written (free space, then start the service again)") \
                    from None
            if error.sqlite_errorcode & 0xFF in _UNWRITABLE:
                raise StateStoreError(f"{self.where}: the {self.kind} file cannot be written: {error}") from None
            raise

    def close(self) -> None:
        self.connection.close()


class SqliteReading:
    """Read-only queries of an existing SQLite database (``target``: a file
    URI or :func:`memory_uri`'s, opened ``mode=ro``), shown as ``where``."""

    def __init__(self, target: str, where: str) -> None:
        self.where = where
        self.connection = sqlite3.connect(target, uri=True, check_same_thread=False)

    def rows(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query, strings as written; a database that cannot
        answer is a :class:`StateStoreError` naming it."""
        try:
            rows = self.connection.execute(statement, stored_parameters(parameters)).fetchall()
        except sqlite3.Error as error:
            raise StateStoreError(f"{self.where}: the view store did not answer: {first_line(error)}") from None
        return [read_row(row) for row in rows]

    def close(self) -> None:
        self.connection.close()


def first_line(error: BaseException) -> str:
    """The first line of an error's message (a driver's go on for lines)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def load_held(db: Connection, session_id: str) -> list[HeldRow]:
    """A session's held ``(seq, value, count)`` rows."""
    return db.execute("SELECT seq, value, count FROM held WHERE session_id = ? ORDER BY seq", (session_id,)).fetchall()


def store_held(db: Connection, sessions: Iterable[tuple[str, HeldChanges]]) -> None:
    """Write what changed in sessions' held records (``(session_id,``
    :meth:`HeldRecords.changes` ``)`` pairs, inside a transaction; one
    statement per kind of change, whatever the sessions)."""
    removed, added = [], []
    for session_id, (gone, new) in sessions:
        removed += [(session_id, seq) for seq in gone]
        added += [(session_id, seq, value, count) for seq, value, count in new]
    db.executemany("DELETE FROM held WHERE session_id = ? AND seq = ?", removed)
    db.executemany("INSERT INTO held (session_id, seq, value, count) VALUES (?, ?, ?, ?)", added)


def replace_held(db: Connection, session_id: str, rows: Sequence[HeldRow]) -> None:
    """Make a session's held rows ``rows`` (a snapshot's, inside a
    transaction), writing only the difference: a seq's held bytes never
    change (other bytes are a conflicting writer's, refused), so rows kept
    are not written again however often the session is stored."""
    stored = {seq for (seq,) in db.execute("SELECT seq FROM held WHERE session_id = ?", (session_id,))}
    wanted = {seq for seq, _, _ in rows}
    db.executemany("DELETE FROM held WHERE session_id = ? AND seq = ?", [(session_id, seq) for seq in stored - wanted])
    db.executemany("INSERT INTO held (session_id, seq, value, count) VALUES (?, ?, ?, ?)",
                   [(session_id, seq, value, count) for seq, value, count in rows if seq not in stored])


def applied_digest(db: Connection, session_id: str, seq: int) -> AppliedDigest | None:
    """The stored ``(count, sha256)`` of the record a session applied at ``seq``."""
    row = db.execute("SELECT count, digest FROM applied WHERE session_id = ? AND seq = ?",
                     (session_id, seq)).fetchone()
    return None if row is None else (row[0], row[1])


def store_digests(db: Connection, sessions: Iterable[tuple[str, Mapping[int, AppliedDigest]]]) -> None:
    """Write sessions' digests by seq (``(session_id,``
    :meth:`AppliedDigests.changes` ``)`` pairs), in one statement."""
    db.executemany("INSERT INTO applied (session_id, seq, count, digest) VALUES (?, ?, ?, ?) ON CONFLICT "
                   "(session_id, seq) DO UPDATE SET count = excluded.count, digest = excluded.digest",
                   [(session_id, seq, count, digest) for session_id, digests in sessions
                    for seq, (count, digest) in digests.items()])
