"""A real PostgreSQL server of the machine's own binaries, on a free loopback port.

The PostgreSQL counterpart of :mod:`dsh_pipeline.local_kafka`: without an
existing server (:data:`DSN_ENVIRONMENT`), tests and the demo start one.

* Binaries: ``initdb``, ``postgres`` and ``psql`` from Debian's
  ``/usr/lib/postgresql/<newest version>/bin``, else from ``PATH``.
  ``postgres`` runs directly (not through ``pg_ctl``, which detaches it) so
  that it stays this process's child and can die with it.
* Start: ``initdb`` (once, for a persistent data dir), ``postgres`` on
  127.0.0.1 with its unix socket in the data folder (0700: the server's
  user's only), wait until ``psql`` answers a query, create database
  ``dsh``. A port taken in between is retried on a new port.
* Access: every connection, socket or TCP, logs in with SCRAM-SHA-256 as
  the superuser, whose random password initdb sets. The password lives in
  a libpq password file, ``dsh.pgpass`` in the data folder, only its
  owner's (0600); :attr:`LocalPostgres.dsn` names that file
  (``?passfile=``), never the password, so a DSN on a command line shows
  no secret and another local user cannot log in.
* Stop: SIGINT (fast shutdown), SIGKILL after a deadline; a temporary
  folder is removed.
* The server dies with the process that started it (Linux parent-death
  signal); the temporary folder such a crash leaves is removed by the next
  start.
* PostgreSQL refuses to run as root: as root, ``initdb`` and ``postgres``
  run as the unprivileged ``postgres`` user Debian's package creates.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from dsh_core.errors import PipelineError
from dsh_pipeline.local_resources import free_ports, private_file

__all__ = ["DSN_ENVIRONMENT", "LocalPostgres", "create_database"]

#: An existing server to use instead of a local one (a libpq URI).
DSN_ENVIRONMENT = "DSH_POSTGRES_DSN"

_DATABASE = "dsh"  # created at start: the database of dsn
_PROGRAMS = ("initdb", "postgres", "psql")
_DEBIAN_ROOT = Path("/usr/lib/postgresql")
_SUPERUSER = "postgres"  # the official image's superuser: the same DSN shape serves both
_RUN_AS = "postgres"  # the unprivileged user Debian's package creates, for root
_TEMPORARY_PREFIX = "dsh-postgres-"
_OWNER_FILE = "owner.pid"
_PASSWORD_FILE = "dsh.pgpass"  # in the data folder: the superuser's password, as libpq reads it
_HBA = """# written by dsh-pipeline: from this machine only, with the superuser's password
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
"""
_CREATE_DATABASE = (f"SELECT 'CREATE DATABASE {_DATABASE}' "
                    f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{_DATABASE}')\\gexec\n")


def _version(folder: Path) -> tuple[int, ...]:
    """``16`` or ``9.6`` as a number to sort by; () for other names."""
    try:
        return tuple(int(part) for part in folder.name.split("."))
    except ValueError:
        return ()


def _find_programs() -> dict[str, str]:
    """Each of :data:`_PROGRAMS` by name: Debian's newest version, else PATH."""
    for folder in sorted(_DEBIAN_ROOT.glob("*/bin"), key=lambda bin_dir: _version(bin_dir.parent), reverse=True):
        if all((folder / name).is_file() for name in _PROGRAMS):
            return {name: str(folder / name) for name in _PROGRAMS}
    found = {name: shutil.which(name) for name in _PROGRAMS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise PipelineError(
            f"PostgreSQL's binaries are not installed: no {_DEBIAN_ROOT}/<version>/bin holds {', '.join(_PROGRAMS)}, "
            f"and {', '.join(missing)} not on PATH; install Debian's server (`apt-get install postgresql`, as root) "
            f"or set {DSN_ENVIRONMENT} to an existing server")
    return {name: path for name, path in found.items() if path is not None}


def _account() -> pwd.struct_passwd | None:
    """Who runs initdb and postgres: None for this process's own user; for
    root (which PostgreSQL refuses to run as), the ``postgres`` user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_RUN_AS)
    except KeyError:
        raise PipelineError(f"PostgreSQL refuses to run as root, and there is no {_RUN_AS!r} user to run it as: "
                            "`apt-get install postgresql` creates one, or run as an unprivileged user") from None


def _as(account: pwd.struct_passwd | None) -> dict[str, Any]:
    """subprocess arguments running a child as ``account`` (without root's groups)."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _die_with_parent() -> None:  # runs in the child before exec (Linux), after it took on its user
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG: a fast shutdown, whoever else is connected
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_abandoned() -> None:
    """Remove temporary server folders whose owning process is gone (killed
    before it could clean up; its server died with it)."""
    for folder in Path(tempfile.gettempdir()).glob(_TEMPORARY_PREFIX + "*"):
        try:
            owner = int((folder / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or still being created
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


class LocalPostgres:
    """One PostgreSQL server. Use as a context manager, or start/stop by hand.

    ``data_dir`` None means a temporary folder removed at stop; a given
    folder keeps its databases across restarts. The binaries are looked up
    here: a :class:`PipelineError` says how to install them. Once started,
    :attr:`dsn` is the database ``dsh``'s libpq URI.
    """

    def __init__(self, data_dir: Path | None = None) -> None:
        self._programs = _find_programs()
        self._temporary = data_dir is None
        self._folder: Path | None = None  # the temporary folder holding data_dir
        self.data_dir: Path | None = None if data_dir is None else Path(data_dir)
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.dsn: str | None = None
        self._log_start = 0  # where this start's part of the log begins

    @property
    def log_path(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir / "postgres.log"

    def start(self, timeout: float = 60.0) -> str:
        """Start the server; returns :attr:`dsn` once it answers queries."""
        try:
            return self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, deadline: float) -> str:
        account = _account()
        if self._temporary:
            _sweep_abandoned()
            self._folder = Path(tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX))
            (self._folder / _OWNER_FILE).write_text(str(os.getpid()))
            if account is not None:
                os.chown(self._folder, account.pw_uid, account.pw_gid)
            self.data_dir = self._folder / "data"
        assert self.data_dir is not None
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(account)
        elif not self.password_file.exists():
            raise PipelineError(f"{self.data_dir} was made by an earlier dsh-pipeline, which let every local user in "
                                f"without a password, and has no {_PASSWORD_FILE}: remove it to start afresh")
        last_error = ""
        for _ in range(3):  # a port taken between probe and bind: try a new port
            port = free_ports(1)[0]
            self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self._server_command(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    cwd="/", preexec_fn=_die_with_parent, **_as(account))
            last_error = self._wait_ready(port, deadline)
            if not last_error:
                self._psql(port, _CREATE_DATABASE, check=True)
                self.port, self.dsn = port, self._dsn(port, _DATABASE)
                return self.dsn
            self._terminate()
            if "could not bind" not in last_error:
                break
        raise PipelineError(f"PostgreSQL server in {self.data_dir} did not start: {last_error}")

    def _initdb(self, account: pwd.struct_passwd | None) -> None:
        assert self.data_dir is not None
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if account is not None:
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
        password = secrets.token_urlsafe(24)
        with tempfile.NamedTemporaryFile("w", prefix="dsh-initdb-") as given:  # 0600: initdb reads it, no one else
            given.write(password + "\n")
            given.flush()
            if account is not None:
                os.chown(given.name, account.pw_uid, account.pw_gid)
            command = [self._programs["initdb"], "--pgdata", str(self.data_dir), "--username", _SUPERUSER,
                       "--pwfile", given.name, "--encoding", "UTF8", "--locale", "C", "--auth", "scram-sha-256"]
            if self._temporary:
                command.append("--no-sync")  # a throwaway server: nothing to keep through a power cut
            done = subprocess.run(command, capture_output=True, text=True, cwd="/", check=False, **_as(account))
        if done.returncode != 0:
            who = f" (run as the {_RUN_AS} user, who must be able to reach it)" if account is not None else ""
            raise PipelineError(f"{command[0]} of {self.data_dir}{who} failed with code {done.returncode}: "
                                f"{(done.stderr or done.stdout)[-1500:].strip()}")
        (self.data_dir / "pg_hba.conf").write_text(_HBA)
        private_file(self.password_file, f"*:*:*:{_SUPERUSER}:{password}\n")  # libpq's format, host:port:db:user:pw

    @property
    def password_file(self) -> Path:
        """The libpq password file holding the superuser's password (0600)."""
        assert self.data_dir is not None
        return self.data_dir / _PASSWORD_FILE

    def _dsn(self, port: int, database: str) -> str:
        return (f"postgresql://{_SUPERUSER}@127.0.0.1:{port}/{database}"
                f"?passfile={quote(str(self.password_file), safe='/')}")

    def _server_command(self, port: int) -> list[str]:
        assert self.data_dir is not None
        # fsync off: a throwaway test/demo server, removed at stop, needs no
        # durability through a crash; a persistent data dir keeps it on
        fsync = "off" if self._temporary else "on"
        return [self._programs["postgres"], "-D", str(self.data_dir), "-p", str(port), "-k", str(self.data_dir),
                "-c", "listen_addresses=127.0.0.1", "-c", f"fsync={fsync}"]

    def _psql(self, port: int, script: str, check: bool = False) -> bool:
        """Run ``script`` on database postgres; whether it succeeded."""
        done = subprocess.run([self._programs["psql"], "--no-psqlrc", "--no-password", "--quiet",
                               "--set", "ON_ERROR_STOP=1", "--dbname", self._dsn(port, "postgres") + "&connect_timeout=5"],
                              input=script, capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise PipelineError(f"psql on 127.0.0.1:{port} failed with code {done.returncode} running "
                                f"{script.strip()!r}: {done.stderr[-1500:]}")
        return done.returncode == 0

    def _wait_ready(self, port: int, deadline: float) -> str:
        """'' when it answers a query, else why not (the log's tail)."""
        assert self.process is not None
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                return f"exited with code {code}; log {self.log_path}:\n{self._log_tail()}"
            if self._psql(port, "SELECT 1;"):
                return ""
            time.sleep(0.1)  # wait-ok: polling a child process with a deadline
        return f"no answer on 127.0.0.1:{port} within the deadline; log {self.log_path}:\n{self._log_tail()}"

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return "\n".join(log.read().decode(errors="replace").splitlines()[-30:])
        except OSError:
            return "(no log)"

    def _terminate(self, grace: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)  # fast shutdown: end the sessions, checkpoint, exit
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def stop(self) -> None:
        """Stop the server (idempotent); a temporary folder is removed."""
        self._terminate()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> "LocalPostgres":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def create_database(server_dsn: str, prefix: str = "dsh") -> str:
    """A new, empty database on the server ``server_dsn`` names (a
    ``postgresql://`` URI): its URI. Each run of a test, benchmark or demo
    gets one of its own."""
    import psycopg
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(server_dsn)._replace(path=f"/{name}"))
