"""The view store's contract (:mod:`tests.view_store_contract`) on
PostgreSQL, a fresh database per test; and what only PostgreSQL's
databases can differ in (collation, encoding)."""

from __future__ import annotations

import urllib.parse

import psycopg
import pytest

from consumers.projector import ViewStore
from consumers.projector.reader import SessionFilter
from consumers.projector.store import SessionChange
from consumers.projector.store_reader import StoreReader
from consumers.runtime.store_backends import POSTGRESQL
from consumers.runtime.errors import StateStoreError
from dsh_pipeline.local_postgres import create_database
from tests import postgres_fixture
from tests.view_store_contract import ViewStoreContract

postgres_dsn = postgres_fixture.postgres_dsn


class TestPostgreSQL(ViewStoreContract):
    backend = POSTGRESQL

    def server(self, request: pytest.FixtureRequest) -> str | None:
        return request.getfixturevalue("postgres_dsn")


def _database(postgres_dsn, options: str) -> str:
    """A fresh database created with ``options``."""
    location = create_database(postgres_dsn, "test")
    name = urllib.parse.urlsplit(location).path.lstrip("/")  # (the DSN's query names its password file)
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE {name}")
        connection.execute(f"CREATE DATABASE {name} TEMPLATE template0 {options}")
    return location


def test_sessions_are_listed_in_one_order_on_both_backends_whatever_the_collation(tmp_path, postgres_dsn):
    """Text compares by code point on both backends: a PostgreSQL database
    whose default collation is a language's lists like the SQLite file."""
    locations = [tmp_path / "views.sqlite", _database(postgres_dsn, "LOCALE_PROVIDER icu ICU_LOCALE 'und'")]
    orders = []
    for location in locations:
        store = ViewStore(location)
        try:
            store.write([SessionChange(session_id, 0, {"sessionId": session_id, "status": "open", "header": None,
                                                       "nextSeq": 1, "turns": [], "usage": []}, None, None, (), (),
                                       None, {}, 5) for session_id in ("a-1", "B-1", "é-1", "b-1")], store.claim([0]))
        finally:
            store.close()
        reader = StoreReader(location)
        try:
            orders.append([item["sessionId"] for item in reader.sessions(SessionFilter())["items"]])
        finally:
            reader.close()
    assert orders == [["é-1", "b-1", "a-1", "B-1"]] * 2


def test_a_database_whose_text_cannot_hold_every_character_is_refused(postgres_dsn):
    location = _database(postgres_dsn, "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'")
    with pytest.raises(StateStoreError, match=r"the database's encoding is SQL_ASCII, whose text cannot hold every "
                                              r"character a log may: the view-store needs a UTF8 database"):
        ViewStore(location)
