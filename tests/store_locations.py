"""New, empty view-store locations on each backend of the registry
(:data:`~consumers.runtime.store_backends.BACKENDS`), for the store
contract, the service tests and the fuzzer."""

from __future__ import annotations

import urllib.parse
import uuid
from pathlib import Path

from consumers.runtime.store_backends import BACKENDS, MEMORY, POSTGRESQL, SQLITE, Backend
from dsh_pipeline.local_postgres import create_database

#: The backends a test runs on without a server (the unit tier's); the
#: others need one (the integration tier's).
SERVERLESS = tuple(backend for backend in BACKENDS if backend is not POSTGRESQL)


def new_location(backend: Backend, folder: Path, postgres_dsn: str | None = None) -> Path | str:
    """A location no store is at yet: a file in ``folder``, a new database
    on ``postgres_dsn``'s server, a new name in this process's memory."""
    if backend is SQLITE:
        return folder / f"views-{uuid.uuid4().hex[:8]}.sqlite"
    if backend is MEMORY:
        return f"memory://test-{uuid.uuid4().hex}"
    if backend is POSTGRESQL:
        if postgres_dsn is None:
            raise ValueError("a PostgreSQL location needs a server (postgres_dsn)")
        return create_database(postgres_dsn, "test")
    raise LookupError(f"no test location for the {backend.name!r} backend: add one to tests/store_locations.py")


def discard_location(location: Path | str, postgres_dsn: str | None = None) -> None:
    """Free what :func:`new_location` made (a file is left to its folder)."""
    if isinstance(location, str) and location.startswith("memory://"):
        MEMORY.discard(location)
    elif isinstance(location, str) and postgres_dsn is not None:
        import psycopg
        name = urllib.parse.urlsplit(location).path.lstrip("/")
        with psycopg.connect(postgres_dsn, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
