"""A store location's backend is decided in one place: a path is SQLite's,
a known URI scheme its backend's, any other scheme a named error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from consumers.projector.store import ViewStore
from consumers.projector.store_reader import StoreReader
from consumers.runtime.errors import StateStoreError, StoreLocationError
from consumers.runtime.store_backends import BACKENDS, MEMORY, POSTGRESQL, SCHEMES, SQLITE, backend_of, store_location

UNKNOWN = "mysql://dsh:secret@db.example/views"


@pytest.mark.parametrize(("given", "backend"), [
    ("views.sqlite", SQLITE), ("/data/views.sqlite", SQLITE), ("./mysql://x", SQLITE), (Path("views.sqlite"), SQLITE),
    ("postgresql://dsh@db/views", POSTGRESQL), ("postgres://dsh@db/views", POSTGRESQL),
    ("PostgreSQL://dsh@db/views", POSTGRESQL), ("memory://trial", MEMORY),
])
def test_a_path_is_sqlite_and_a_known_scheme_its_backend(given, backend):
    assert backend_of(given) is backend


def test_every_scheme_names_one_backend_of_the_registry():
    assert {scheme: backend.name for scheme, backend in SCHEMES.items()} == {
        "postgresql": "postgresql", "postgres": "postgresql", "memory": "memory"}
    assert [backend.name for backend in BACKENDS] == ["sqlite", "postgresql", "memory"]


@pytest.mark.parametrize("open_store", [store_location, ViewStore, StoreReader])
def test_an_unknown_scheme_is_refused_by_name_listing_the_schemes_there_are(open_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreLocationError) as refused:
        open_store(UNKNOWN)
    assert str(refused.value) == ("mysql://…: no store backend of this build takes the scheme 'mysql'; a store is a "
                                  "SQLite file's path or a URI of postgresql://, postgres:// or memory://")
    assert not list(tmp_path.iterdir())  # no SQLite file named like the URI


def test_a_memory_store_is_one_store_per_name_for_this_process_only(tmp_path):
    location = "memory://trial-of-test-store-backends"
    ViewStore(location).close()
    try:
        reader = StoreReader(location)  # the store outlives the writer that made it
        assert reader.where == location and reader.counts() == {"sessions": 0, "findings": 0, "deadLetters": 0}
        reader.close()
        done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "sessions", "--store", location],
                              capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert (done.returncode, done.stderr) == (1, f"dsh-pipeline sessions: StateStoreError: {location}: no view "
                                                     "store there (a memory:// store is seen only by the process "
                                                     "that made it)\n")
    finally:
        MEMORY.discard(location)
    with pytest.raises(StateStoreError, match="no view store there"):
        StoreReader(location)
    with pytest.raises(StoreLocationError, match=r"memory://: a memory:// store needs a name \(memory://NAME\)"):
        ViewStore("memory://")


@pytest.mark.parametrize("command", [
    ["project", "--bootstrap", "127.0.0.1:1", "--wait-for-cluster", "0"], ["sessions"], ["view", "some-session"],
])
def test_the_commands_refuse_it_before_anything_else(command, tmp_path):
    done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *command, "--store", UNKNOWN],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"dsh-pipeline {command[0]}: StoreLocationError: mysql://…: no store backend "
                                        "of this build takes the scheme 'mysql'; a store is a SQLite file's path or a "
                                        "URI of postgresql://, postgres:// or memory://"]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("location", "said"), [
    ("postgresql://dsh:secret@127.0.0.1:{port}/views",
     "postgresql://dsh:***@127.0.0.1:{port}/views: cannot connect to the view store: connection failed: connection "
     "to server at \"127.0.0.1\", port {port} failed: Connection refused"),
    ("postgresql://dsh:secret@127.0.0.1:{port}/views?no_such_option=1",
     "postgresql://dsh:***@127.0.0.1:{port}/views?no_such_option=1: not a PostgreSQL URI libpq takes: invalid URI "
     "query parameter: \"no_such_option\""),
])
def test_a_store_that_does_not_answer_is_one_line_of_the_projects_own(location, said, free_tcp_port, tmp_path):
    given = location.format(port=free_tcp_port)
    done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "sessions", "--store", given],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stderr) == (1, f"dsh-pipeline sessions: StateStoreError: "
                                                 f"{said.format(port=free_tcp_port)}\n")
