"""A store location's backend is decided in one place: a path is SQLite's,
a known URI scheme PostgreSQL's, any other scheme a named error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from consumers.projector.store import ViewStore
from consumers.projector.store_reader import StoreReader
from consumers.runtime.store_location import SCHEMES, store_backend, store_location
from consumers.runtime.errors import StoreLocationError

UNKNOWN = "mysql://dsh:secret@db.example/views"


@pytest.mark.parametrize(("given", "backend"), [
    ("views.sqlite", "sqlite"), ("/data/views.sqlite", "sqlite"), ("./mysql://x", "sqlite"),
    (Path("views.sqlite"), "sqlite"), ("postgresql://dsh@db/views", "postgresql"),
    ("postgres://dsh@db/views", "postgresql"), ("PostgreSQL://dsh@db/views", "postgresql"),
])
def test_a_path_is_sqlite_and_a_known_scheme_postgresql(given, backend):
    assert store_backend(given) == backend


@pytest.mark.parametrize("open_store", [store_location, ViewStore, StoreReader])
def test_an_unknown_scheme_is_refused_by_name_listing_the_schemes_there_are(open_store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreLocationError) as refused:
        open_store(UNKNOWN)
    assert str(refused.value) == ("mysql://…: no store backend of this build takes the scheme 'mysql'; a store is a "
                                  "SQLite file's path or a URI of postgresql://, postgres:// (PostgreSQL)")
    assert sorted(SCHEMES) == ["postgres", "postgresql"]
    assert not list(tmp_path.iterdir())  # no SQLite file named like the URI


@pytest.mark.parametrize("command", [
    ["project", "--bootstrap", "127.0.0.1:1", "--wait-for-cluster", "0"], ["sessions"], ["view", "some-session"],
])
def test_the_commands_refuse_it_before_anything_else(command, tmp_path):
    done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *command, "--store", UNKNOWN],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"dsh-pipeline {command[0]}: StoreLocationError: mysql://…: no store backend "
                                        "of this build takes the scheme 'mysql'; a store is a SQLite file's path or a "
                                        "URI of postgresql://, postgres:// (PostgreSQL)"]
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
