"""The view store's contract (:mod:`tests.view_store_contract`) on the
backends that need no server: this process's memory and a SQLite file;
and every backend of the registry has its run of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.projector.store_reader import StoreReader
from consumers.runtime.store_backends import BACKENDS, MEMORY, SQLITE
from consumers.runtime.errors import StateStoreError
from tests.integration.consumers.projector import test_view_store_contract as server_runs
from tests.view_store_contract import ViewStoreContract


class TestMemory(ViewStoreContract):
    backend = MEMORY


class TestSQLite(ViewStoreContract):
    backend = SQLITE

    def test_a_reader_leaves_no_file_where_there_was_none(self, tmp_path: Path) -> None:
        with pytest.raises(StateStoreError, match=r"missing.sqlite: no view store there \(the projector's --store\)"):
            StoreReader(tmp_path / "missing.sqlite")
        assert not (tmp_path / "missing.sqlite").exists()


def test_every_backend_of_the_registry_runs_the_contract() -> None:
    """A backend added to the registry fails here until its run is added
    (in the integration tier if it needs a server, like PostgreSQL's)."""
    runs = {run.backend.name: run for run in ViewStoreContract.__subclasses__()}
    assert runs.get("postgresql") is server_runs.TestPostgreSQL
    assert sorted(runs) == sorted(backend.name for backend in BACKENDS)
