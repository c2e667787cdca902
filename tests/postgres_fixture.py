"""PostgreSQL for tests: one server per test session.

Server: ``$DSH_POSTGRES_DSN`` when set (an existing server); else the
project's own :class:`~dsh_pipeline.local_postgres.LocalPostgres`, skipped,
saying why, where PostgreSQL's binaries are not installed (``make test``
installs Debian's package as root).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.local_postgres import DSN_ENVIRONMENT, LocalPostgres, create_database


def local_postgres_or_skip(data_dir: Path | None = None) -> LocalPostgres:
    """A not yet started server; the test is skipped when the binaries are absent."""
    try:
        return LocalPostgres(data_dir)
    except PipelineError as error:
        pytest.skip(str(error))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request, tmp_path):
    """A view store location on each backend: a SQLite path, a fresh
    PostgreSQL database (the test is skipped where there is no server)."""
    if request.param == "sqlite":
        return tmp_path / "views.sqlite"
    return create_database(request.getfixturevalue("postgres_dsn"), "test")


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    configured = os.environ.get(DSN_ENVIRONMENT)
    if configured:
        yield configured
        return
    with local_postgres_or_skip() as server:
        assert server.dsn is not None
        yield server.dsn

