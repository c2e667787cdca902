"""PostgreSQL for tests: one server per test session.

Server: ``$DSH_POSTGRES_DSN`` when set (an existing server); else the
project's own :class:`~dsh_pipeline.local_postgres.LocalPostgres`, skipped,
saying why, where PostgreSQL's binaries are not installed (``make test``
installs Debian's package as root).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.local_postgres import DSN_ENVIRONMENT, LocalPostgres


def local_postgres_or_skip(data_dir: Path | None = None) -> LocalPostgres:
    """A not yet started server; the test is skipped when the binaries are absent."""
    try:
        return LocalPostgres(data_dir)
    except PipelineError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    configured = os.environ.get(DSN_ENVIRONMENT)
    if configured:
        yield configured
        return
    with local_postgres_or_skip() as server:
        assert server.dsn is not None
        yield server.dsn


def fresh_database(server_dsn: str) -> str:
    """A new, empty database on the server: its ``postgresql://`` URI."""
    import psycopg
    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(server_dsn)._replace(path=f"/{name}"))
