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

from .database import Migrations, claim_layout
from .errors import StateStoreError
from .stored_text import read_row, stored_parameters

__all__ = ["PostgresDatabase", "display_location", "first_line", "postgres_sql", "text_rows", "without_password"]

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


@functools.lru_cache(maxsize=512)
def postgres_sql(statement: str) -> str:
    """A statement of the SQLite stores as PostgreSQL takes it."""
    return _TYPES.sub(lambda match: _TYPE_NAMES[match.group(0)], statement).replace("?", "%s")


class _Connection:
    """A psycopg connection speaking the statements of the SQLite stores."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection
        #: Staging tables created on this connection, by ``(table, columns)``.
        self.staging: dict[tuple[str, str], str] = {}

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
            if not committed:
                self.connection.staging.clear()  # any made in it are gone with it

    def close(self) -> None:
        self.raw.close()


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


def first_line(error: Exception) -> str:
    """The first line of an error's message (a driver's go on for lines)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
