"""A service's store on PostgreSQL: the same kind, layout and statements as
its SQLite file (:class:`~consumers.runtime.database.Database`), so one
store class runs on either.

The statements are written once, in the dialect both servers share; the
few words that differ are translated here and nowhere else: ``?``
placeholders become ``%s``, ``BLOB`` becomes ``BYTEA``, ``INTEGER``
``BIGINT`` (seqs and offsets reach 2^53), ``TEXT`` compares by code point
(``COLLATE "C"``, SQLite's order, whatever the database's default), and
SQLite's ``WITHOUT ROWID`` is dropped. Text is kept as :mod:`.stored_text`
writes it, as in the SQLite file (PostgreSQL's text holds no NUL, which a
log's text may), in a database that must be UTF8. Many processes on many
hosts may share one database: the layout is claimed and migrated under an
advisory lock, and every transaction is one of PostgreSQL's.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import unquote

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from .database import Migrations, claim_layout, first_line
from .errors import StateStoreError
from .stored_text import read_row, stored_parameters

__all__ = ["PostgresDatabase", "PostgresReading", "display_location", "first_line", "postgres_sql", "text_rows",
           "without_password"]

_TYPES = re.compile(r"\bBLOB\b|\bINTEGER\b|\bTEXT\b| WITHOUT ROWID")
#: Text compares by code point, as SQLite's does, whatever the database's default collation.
_TYPE_NAMES = {"BLOB": "BYTEA", "INTEGER": "BIGINT", "TEXT": 'TEXT COLLATE "C"', " WITHOUT ROWID": ""}
#: An insert of rows whose conflict clause takes no parameters of its own:
#: many such rows go in by ``COPY`` (see :meth:`_Connection.executemany`).
_ROW_INSERT = re.compile(r"INSERT INTO (\w+) \(([^)]*)\) VALUES \(\?(?:, \?)*\)([^?]*)")
#: From this many rows an insert is copied in; fewer go by ``executemany``
#: (which psycopg pipelines): a copy costs three round trips however few
#: its rows.
_COPY_ROWS = 64
#: The advisory lock the layout is claimed under (any constant: "dsh" in ASCII).
_LAYOUT_LOCK = 0x647368
#: How long a reading may take to lend a working connection.
_CONNECT_SECONDS = 5


@functools.lru_cache(maxsize=512)
def postgres_sql(statement: str) -> str:
    """A statement of the SQLite stores as PostgreSQL takes it."""
    return _TYPES.sub(lambda match: _TYPE_NAMES[match.group(0)], statement).replace("?", "%s")


class _Connection:
    """A psycopg connection speaking the statements of the SQLite stores."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection
        #: Staging tables created on this connection, by ``(table, columns)``
        #: (temporary tables: they last as long as the connection).
        self.staging: dict[tuple[str, str], str] = {}
        self._made: list[tuple[str, str]] = []  # those the open transaction created

    def ended(self, committed: bool) -> None:
        """A transaction ended: the staging tables it created are gone with
        it unless it ``committed``; those of earlier transactions stay."""
        if not committed:
            for made in self._made:
                del self.staging[made]
        self._made.clear()

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> psycopg.Cursor:
        return self.connection.execute(postgres_sql(statement), stored_parameters(parameters))

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for every row. Many rows of an insert are
        copied into a temporary staging table and inserted from there in
        one statement, conflict clause and all: the driver's work per row
        is then the copy protocol's, a fraction of binding a statement's
        parameters. The rows of one call hold each key once (as every
        caller writes them): ``ON CONFLICT DO UPDATE`` takes a key once per
        statement."""
        rows = [stored_parameters(row) for row in rows]
        insert = _ROW_INSERT.fullmatch(statement)
        if insert is not None and len(rows) >= _COPY_ROWS:
            table, columns, conflict = insert.groups()
            self._copy_insert(table, columns, conflict, rows)
        elif rows:
            with self.connection.cursor() as cursor:
                cursor.executemany(postgres_sql(statement), rows)

    def _copy_insert(self, table: str, columns: str, conflict: str, rows: list[Sequence[Any]]) -> None:
        staging = self.staging.get((table, columns))
        if staging is None:
            staging = f"dsh_staging_{len(self.staging)}"
            self.connection.execute(f"CREATE TEMPORARY TABLE {staging} ON COMMIT DELETE ROWS AS "
                                    f"SELECT {columns} FROM {table} WITH NO DATA")
            self.staging[table, columns] = staging
            self._made.append((table, columns))
        else:
            self.connection.execute(f"TRUNCATE {staging}")
        with self.connection.cursor() as cursor, cursor.copy(f"COPY {staging} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        self.connection.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {staging}{conflict}")


class PostgresDatabase:
    """A service's tables of one kind and layout in a PostgreSQL database."""

    def __init__(self, dsn: str, kind: str, layout: int, schema: Sequence[str],
                 migrations: Migrations | None = None) -> None:
        self.where = display_location(dsn)
        self.kind = kind
        try:
            self.raw = psycopg.connect(dsn, autocommit=True, application_name=f"dsh-pipeline {kind}",
                                       row_factory=text_rows)
        except psycopg.Error as error:
            raise StateStoreError(f"{self.where}: cannot connect for the {kind}: "
                                  f"{without_password(first_line(error), dsn)}") from None
        self.connection = _Connection(self.raw)
        try:
            encoding = self.raw.info.parameter_status("server_encoding")
            if encoding != "UTF8":
                raise StateStoreError(f"{self.where}: the database's encoding is {encoding}, whose text cannot hold "
                                      f"every character a log may: the {kind} needs a UTF8 database")
            with self.transaction() as db:
                db.execute("SELECT pg_advisory_xact_lock(?)", (_LAYOUT_LOCK,))
                tables = {row[0] for row in db.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
                claim_layout(db, self.where, kind, layout, schema, migrations or {}, tables)
        except BaseException:
            self.raw.close()
            raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Connection]:
        """One PostgreSQL transaction, rolled back on any failure."""
        committed = False
        try:
            with self.raw.transaction():
                yield self.connection
            committed = True
        except psycopg.OperationalError as error:
            raise StateStoreError(f"{self.where}: the {self.kind} is unreachable: {first_line(error)}") from None
        except (psycopg.DataError, psycopg.IntegrityError):
            raise  # refused for what a row holds, as SQLite's own errors are: its caller names the row
        except psycopg.Error as error:
            raise StateStoreError(f"{self.where}: the {self.kind} refused a write: {first_line(error)}") from None
        finally:
            self.connection.ended(committed)

    def close(self) -> None:
        self.raw.close()


class PostgresReading:
    """Read-only queries of a view store in a PostgreSQL database, over a
    small pool of connections: it checks a connection before lending it
    and replaces a broken one."""

    def __init__(self, dsn: str) -> None:
        self.where = display_location(dsn)
        self.pool = _pool(dsn, self.where)

    def rows(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query, strings as written; a server that cannot
        answer is a :class:`StateStoreError` naming it."""
        try:
            with self.pool.connection(timeout=_CONNECT_SECONDS) as connection:
                rows = connection.execute(postgres_sql(statement), stored_parameters(parameters)).fetchall()
        except (psycopg.Error, PoolTimeout) as error:
            raise StateStoreError(f"{self.where}: the view store did not answer: {first_line(error)}") from None
        return [read_row(row) for row in rows]

    def close(self) -> None:
        self.pool.close()


def _pool(dsn: str, where: str) -> ConnectionPool:
    """An open pool of connections to ``dsn``. One connection is made first,
    so a URI libpq cannot parse or a server that does not answer is one
    line here, not the pool's log of each failed attempt before it."""
    try:
        psycopg.connect(dsn, connect_timeout=_CONNECT_SECONDS).close()
    except psycopg.ProgrammingError as error:
        raise StateStoreError(f"{where}: not a PostgreSQL URI libpq takes: "
                              f"{without_password(str(error).strip(), dsn)}") from None
    except psycopg.Error as error:
        raise StateStoreError(f"{where}: cannot connect to the view store: "
                              f"{without_password(first_line(error), dsn)}") from None
    pool = ConnectionPool(dsn, min_size=1, max_size=2, open=False, check=ConnectionPool.check_connection,
                          kwargs={"autocommit": True, "application_name": "dsh-pipeline reader"})
    try:
        pool.open(wait=True, timeout=_CONNECT_SECONDS)
    except PoolTimeout:
        pool.close()
        raise StateStoreError(f"{where}: cannot connect to the view store in {_CONNECT_SECONDS} s (is the server up, "
                              "and the URI's user, host, port and database right?)") from None
    return pool


def text_rows(cursor: Any) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """psycopg's row factory for the stores' rows: strings as written."""
    return read_row


def display_location(dsn: str) -> str:
    """A connection URI as messages may show it: without its password."""
    return without_password(dsn, dsn)


#: Where a DSN keeps a password: a URI's ``user:password@`` (up to the last
#: ``@`` before the query), a ``password=`` parameter (URI query or key=value).
_URI_PASSWORD = re.compile(r"^postgres(?:ql)?://[^:@/?]*:([^?]*)@")
_PARAMETER_PASSWORD = re.compile(r"(?:^|[?&\s])password\s*=\s*('(?:[^'\\]|\\.)*'|[^&\s]*)")


def without_password(text: str, dsn: str) -> str:
    """``text`` with ``dsn``'s password, as written or percent-decoded,
    masked wherever it occurs: libpq quotes the parts of a DSN it cannot
    parse in its errors."""
    written = _URI_PASSWORD.findall(dsn) + [value.strip("'") for value in _PARAMETER_PASSWORD.findall(dsn)]
    for password in sorted({form for value in written for form in (value, unquote(value)) if form}, key=len,
                           reverse=True):
        text = text.replace(password, "***")
    return text
