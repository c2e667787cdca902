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
from consumers.runtime.store_backends import BACKENDS, POSTGRESQL
from dsh_pipeline.local_postgres import DSN_ENVIRONMENT, LocalPostgres
from tests.store_locations import new_location


def local_postgres_or_skip(data_dir: Path | None = None) -> LocalPostgres:
    """A not yet started server; the test is skipped when the binaries are absent."""
    try:
        return LocalPostgres(data_dir)
    except PipelineError as error:
        pytest.skip(str(error))


@pytest.fixture(params=[backend for backend in BACKENDS if backend.shared], ids=lambda backend: backend.name)
def store_location(request, tmp_path):
    """A new view store location on each backend services are deployed on
    (those other processes see): a SQLite path, a fresh PostgreSQL
    database (the test is skipped where there is no server)."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param is POSTGRESQL else None
    return new_location(request.param, tmp_path, dsn)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    configured = os.environ.get(DSN_ENVIRONMENT)
    if configured:
        yield configured
        return
    with local_postgres_or_skip() as server:
        assert server.dsn is not None
        yield server.dsn

