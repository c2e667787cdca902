"""The local PostgreSQL server (Debian's binaries, which ``make test``
installs): it serves reads and writes, two run side by side, it leaves
nothing behind when stopped, and it dies with the process that started it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline import local_postgres
from dsh_pipeline.local_postgres import LocalPostgres
from tests.conftest import ROOT
from tests import postgres_fixture
from tests.other_user import run_as_stranger, stranger
from tests.postgres_fixture import local_postgres_or_skip
from tests.waiting import wait_for

# the session fixture, bound here for pytest to find (an unused import would trip pyflakes)
postgres_dsn = postgres_fixture.postgres_dsn


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_started_server_takes_writes_and_reads_them_back():
    with local_postgres_or_skip() as server:
        assert server.dsn == f"postgresql://postgres@127.0.0.1:{server.port}/dsh?passfile={server.password_file}"
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            connection.execute("CREATE TABLE views (session text PRIMARY KEY, seq bigint NOT NULL)")
            connection.execute("INSERT INTO views VALUES (%s, %s), (%s, %s)", ("s-1", 7, "s-2", 9))
            rows = connection.execute("SELECT session, seq FROM views ORDER BY session").fetchall()
            settings = connection.execute("SELECT current_database(), current_setting('listen_addresses'), "
                                          "current_setting('server_encoding'), current_setting('fsync')").fetchone()
    assert rows == [("s-1", 7), ("s-2", 9)]
    assert settings == ("dsh", "127.0.0.1", "UTF8", "off")  # a throwaway server: fsync off


def test_two_servers_at_once_get_different_ports():
    with local_postgres_or_skip() as first, local_postgres_or_skip() as second:
        assert first.port != second.port
        for server in (first, second):
            assert server.dsn is not None
            with psycopg.connect(server.dsn) as connection:
                assert connection.execute("SHOW port").fetchone() == (str(server.port),)


def test_after_stop_the_port_is_closed_and_the_temporary_folder_gone():
    with local_postgres_or_skip() as server:
        assert server.port is not None and server.data_dir is not None
        port, folder = server.port, server.data_dir.parent
        assert _answers(port) and (server.data_dir / "PG_VERSION").is_file()
    assert not _answers(port), f"127.0.0.1:{port} still answers after stop"
    assert not folder.exists(), f"{folder} is left behind"
    server.stop()  # idempotent


def test_a_persistent_data_dir_keeps_its_tables_and_its_fsync():
    with tempfile.TemporaryDirectory(prefix="dsh-postgres-test-") as parent:
        os.chmod(parent, 0o755)  # as root the server runs as the postgres user, who must reach the folder
        data_dir = Path(parent) / "pg"
        with local_postgres_or_skip(data_dir) as server:
            assert server.dsn is not None
            with psycopg.connect(server.dsn) as connection:
                connection.execute("CREATE TABLE kept (n int)")
                connection.execute("INSERT INTO kept VALUES (42)")
        assert (data_dir / "PG_VERSION").is_file()
        with LocalPostgres(data_dir) as again:
            assert again.dsn is not None
            with psycopg.connect(again.dsn) as connection:
                assert connection.execute("SELECT n FROM kept").fetchall() == [(42,)]
                assert connection.execute("SHOW fsync").fetchone() == ("on",)
        assert (data_dir / "PG_VERSION").is_file()


def test_another_local_user_cannot_log_in_and_no_password_is_on_a_command_line():
    with local_postgres_or_skip() as server:
        stranger()  # skips, saying why, where no other user can be made
        assert server.data_dir is not None
        psql = local_postgres._find_programs()["psql"]
        for target in (f"postgresql://postgres@127.0.0.1:{server.port}/dsh",  # TCP, as the superuser, no password
                       f"postgresql:///dsh?host={server.data_dir}&port={server.port}&user=postgres"):  # the socket
            refused = run_as_stranger([psql, "--no-password", "--no-psqlrc", "--dbname", target, "-c", "SELECT 1"])
            assert refused.returncode != 0, (target, refused.stdout)
            assert "password" in refused.stderr or "Permission denied" in refused.stderr, refused.stderr
        assert server.data_dir.stat().st_mode & 0o777 == 0o700  # the unix socket's folder
        password = server.password_file.read_text().strip().rpartition(":")[2]
        assert server.password_file.stat().st_mode & 0o777 == 0o600 and password not in str(server.dsn)
        assert not any(password.encode() in line for line in _command_lines())


def _command_lines() -> list[bytes]:
    """Every process's command line, as ``ps`` shows them to any user."""
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:  # ended meanwhile
            continue
    return lines

_CHILD = """
import json, sys
from dsh_pipeline.local_postgres import LocalPostgres
server = LocalPostgres()
server.start()
print(json.dumps({"pid": server.process.pid, "port": server.port, "folder": str(server.data_dir.parent)}), flush=True)
sys.stdin.read()  # until killed
"""


def test_the_server_dies_with_the_process_that_started_it():
    local_postgres_or_skip()  # skips without the binaries
    child = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line, f"the child printed no server (exit {child.poll()}): {child.stderr.read() if child.stderr else ''}"
        started = json.loads(line)
        assert _running(started["pid"]) and _answers(started["port"])
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        wait_for(lambda: not _running(started["pid"]), 30, f"postgres pid {started['pid']} to exit after its parent's SIGKILL")
        assert not _answers(started["port"])
    finally:
        child.kill()
        child.communicate(timeout=10)
    folder = Path(started["folder"])
    assert folder.exists()  # no one was left to clean up ...
    with LocalPostgres():
        assert not folder.exists(), f"{folder}, abandoned by a dead owner, was not swept"  # ... the next start does


def test_missing_binaries_say_how_to_install_them(tmp_path, monkeypatch):
    monkeypatch.setattr(local_postgres, "_DEBIAN_ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PipelineError) as raised:
        LocalPostgres()
    message = str(raised.value)
    assert f"no {tmp_path}/<version>/bin holds initdb, postgres, psql" in message
    assert "initdb, postgres, psql not on PATH" in message
    assert "apt-get install postgresql" in message and "DSH_POSTGRES_DSN" in message


def test_the_fixture_serves_a_database(postgres_dsn):
    assert re.match(r"postgres(ql)?://", postgres_dsn)
    with psycopg.connect(postgres_dsn) as connection:
        assert connection.execute("SELECT 1 + 1").fetchone() == (2,)

