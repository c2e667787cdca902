"""A real single-node Kafka (KRaft) broker from Maven Central jars (its ports
and private files: :mod:`dsh_pipeline.local_resources`).

The "embedded default": without a configured cluster, the CLI, the test
fixture and the demo start one of these on free loopback ports.

* Jars: :mod:`dsh_pipeline.kafka_jars` (fetched once by Maven, cached).
* Start: format the storage (kept formatted for a persistent data dir),
  start ``kafka.Kafka``, wait until the log says the server started *and* a
  metadata request answers. A port taken in between is retried on new ports.
* Stop: SIGTERM (controlled shutdown), SIGKILL after a deadline.
* An attached broker dies with the process that started it (Linux parent-
  death signal), so a crashed caller leaves nothing behind; a detached one
  (``dsh-pipeline kafka start``) records its pid in a state file.
* The data folder is its owner's only (0700), and the broker and the storage
  tool run under umask 077: segments, logs and the state file are 0600.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Mapping
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dsh_core.errors import PipelineError
from dsh_pipeline.broker_listeners import SCRAM, ListenerSecurity
from dsh_pipeline.kafka_jars import KAFKA_VERSION, ensure_kafka_jars, java_major, require_tool
from dsh_pipeline.local_resources import free_ports, ports_if_free, private_file
from dsh_kafka.clients import make_admin
from dsh_kafka.config import KafkaConfig

__all__ = ["LocalKafka", "BrokerState", "ClusterNode", "read_state", "probe_metadata", "stop_detached",
           "sweep_abandoned_data_dirs"]

_READY_LINE = "Kafka Server started"

_LOG4J2 = """status=warn
appender.o.type=Console
appender.o.name=O
appender.o.layout.type=PatternLayout
appender.o.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=WARN
rootLogger.appenderRef.o.ref=O
logger.r.name=kafka.server.KafkaRaftServer
logger.r.level=INFO
logger.q.name=org.apache.kafka.raft.QuorumState
logger.q.level=INFO
logger.b.name=kafka.server.BrokerLifecycleManager
logger.b.level=INFO
"""


def _die_with_parent() -> None:  # runs in the child before exec (Linux)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


#: Attached brokers are started from this one thread, which lasts as long as
#: the process: Linux sends the parent-death signal when the *thread* that
#: started a child ends, so a broker started from a short-lived thread (a
#: node restarted from ``asyncio.to_thread``) was stopped as that thread ended.
_LAUNCHER = ThreadPoolExecutor(1, thread_name_prefix="dsh-kafka-launcher")


async def _metadata(kafka: KafkaConfig) -> None:
    admin = make_admin(kafka, request_timeout_ms=5000)
    await admin.start()
    try:
        await admin.list_topics()
    finally:
        await admin.close()


def probe_metadata(kafka: KafkaConfig | str) -> bool:
    """Whether a metadata request to ``kafka`` (a bootstrap address: over
    PLAINTEXT) answers (own loop, own thread)."""
    outcome: list[bool] = []

    def run() -> None:
        try:
            asyncio.run(asyncio.wait_for(_metadata(KafkaConfig(kafka) if isinstance(kafka, str) else kafka), 10))
            outcome.append(True)
        except Exception:  # noqa: BLE001 - any failure means "not serving yet"
            outcome.append(False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(15)
    return bool(outcome and outcome[0])


@dataclass(frozen=True)
class ClusterNode:
    """A broker's place in a cluster of one or more combined broker and
    controller nodes: its id, the controller quorum (``ID@HOST:PORT,...``),
    the copies the cluster keeps of its internal topics and of topics
    created without a replication factor (all but one must acknowledge),
    and the cluster id every node is formatted with (``None``: a new one)."""

    node_id: int
    voters: str
    replicas: int
    cluster_id: str | None = None

    def replication_settings(self) -> list[str]:
        copies, insync = self.replicas, max(1, self.replicas - 1)
        return [f"default.replication.factor={copies}", f"min.insync.replicas={insync}",
                f"offsets.topic.replication.factor={copies}", f"transaction.state.log.replication.factor={copies}",
                f"transaction.state.log.min.isr={insync}", f"share.coordinator.state.topic.replication.factor={copies}",
                f"share.coordinator.state.topic.min.isr={insync}"]


def _java_argument(value: str) -> str:
    """One argument as a line of a java ``@argfile`` (quoted, backslash-escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class BrokerState:
    """What ``dsh-pipeline kafka start`` records for ``status`` and ``stop``."""

    pid: int
    bootstrap: str
    data_dir: str
    log: str
    secured_bootstrap: str | None = None  # the SASL/TLS listener, when it has one
    #: A broker without a plaintext listener: the ``DSH_KAFKA_*`` settings
    #: (no password: a password file) its own user reaches it with.
    admin: dict[str, str] | None = None

    def client(self) -> KafkaConfig:
        """How the broker's own work (readiness, status) reaches it."""
        return KafkaConfig.from_env(self.bootstrap, self.admin or {})


def _state_file(data_dir: Path) -> Path:
    return data_dir / "broker-state.json"


def read_state(data_dir: Path) -> BrokerState | None:
    try:
        return BrokerState(**json.loads(_state_file(data_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None


_TEMPORARY_PREFIX = "dsh-kafka-"
_OWNER_FILE = "owner.pid"


def sweep_abandoned_data_dirs(root: Path | None = None) -> list[Path]:
    """Remove temporary broker folders whose owning process is gone (it was
    killed before it could clean up; its broker died with it). Returns them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(_TEMPORARY_PREFIX + "*"):
        try:
            owner = int((folder / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or still being created
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalKafka:
    """One broker process. Use as a context manager, or start/stop by hand.

    ``data_dir`` None means a temporary folder removed at stop; a given
    folder keeps topics across restarts. ``attached`` brokers die with
    their parent process.
    """

    def __init__(self, data_dir: Path | None = None, *, attached: bool = True, heap: str = "1g",
                 sasl_users: Mapping[str, str] | None = None, tls_keystore: Path | None = None,
                 authorize: bool = False, port: int | None = None, unsigned_oauth: bool = False,
                 client_ca: Path | None = None, admin: str | None = None, admin_password_file: Path | None = None,
                 tls_ca: Path | None = None, node: ClusterNode | None = None) -> None:
        self._temporary = data_dir is None
        if data_dir is None:
            sweep_abandoned_data_dirs()
            data_dir = Path(tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX))
            if attached:  # a detached broker outlives the process that started it
                (data_dir / _OWNER_FILE).write_text(str(os.getpid()))
        self.data_dir = Path(data_dir)
        self.attached = attached
        self.heap = heap
        self.process: subprocess.Popen | None = None
        self._log_start = 0  # where the running process's lines begin in the log
        self.bootstrap: str | None = None
        #: How the listeners take their clients (:class:`ListenerSecurity`).
        self.security = ListenerSecurity(dict(sasl_users or {}), tls_keystore, authorize, unsigned_oauth, client_ca,
                                         admin, admin_password_file, tls_ca)
        self.port = port  # the client port (None: the folder's last one while free, else any)
        self.secured_bootstrap: str | None = None
        #: Its place in a cluster of several nodes (``None``: a cluster of its own).
        self.node = node

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def _command(self, lib: Path, properties: Path) -> list[str]:
        java = require_tool("java", "run the Kafka broker")
        if java_major(java) < 17:
            raise PipelineError(f"Kafka {KAFKA_VERSION} needs Java 17+, found Java {java_major(java)} at {java}")
        return [java, f"-Xmx{self.heap}", "-Xms256m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true", f"-Djava.io.tmpdir={self.data_dir / 'tmp'}",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", f"{lib}/*", "kafka.Kafka", str(properties)]

    def _previous_ports(self) -> list[int] | None:
        properties = self.data_dir / "server.properties"
        if not properties.exists():
            return None
        found = re.search(r"^listeners=(?:PLAINTEXT|SECURED)://127\.0\.0\.1:(\d+),CONTROLLER://127\.0\.0\.1:(\d+)",
                          properties.read_text(), re.MULTILINE)
        return ports_if_free([int(found[1]), int(found[2])]) if found else None

    def _write_config(self, port: int, controller: int, secured_port: int | None = None) -> Path:
        (self.data_dir / "tmp").mkdir(mode=0o700, exist_ok=True)
        private_file(self.data_dir / "log4j2.properties", _LOG4J2)
        node = self.node or ClusterNode(1, f"1@127.0.0.1:{controller}", 1)
        # it holds the SASL users' passwords: the owner's eyes only
        return private_file(self.data_dir / "server.properties", "\n".join([
            "process.roles=broker,controller", f"node.id={node.node_id}", f"controller.quorum.voters={node.voters}",
            *self.security.listeners(port, controller, secured_port), "controller.listener.names=CONTROLLER",
            f"log.dirs={self.data_dir / 'logs'}", "num.partitions=1", "auto.create.topics.enable=false",
            *node.replication_settings(), "offsets.topic.num.partitions=1", "transaction.state.log.num.partitions=1",
            "group.initial.rebalance.delay.ms=0", "message.max.bytes=16777216", "replica.fetch.max.bytes=16777216",
        ]) + "\n")

    def _format(self, lib: Path, properties: Path) -> None:
        if (self.data_dir / "logs" / "meta.properties").exists():
            return  # formatted before: keep the cluster id and node id
        java = require_tool("java", "format the Kafka storage")
        log4j = f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}"
        cluster = [self.node.cluster_id] if self.node and self.node.cluster_id else subprocess.run(
            [java, log4j, "-cp", f"{lib}/*", "kafka.tools.StorageTool", "random-uuid"],
            capture_output=True, text=True, check=False, umask=0o077).stdout.strip().splitlines()
        if not cluster:
            raise PipelineError("kafka StorageTool random-uuid printed no cluster id")
        scram = [argument for name, password in self.security.sasl_users.items() for mechanism in SCRAM
                 for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]
        # the tool takes SCRAM credentials only as arguments: they go in a 0600
        # argument file (java @file), never on the command line others can read
        arguments = self.data_dir / "storage-format.args"
        with os.fdopen(os.open(arguments, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write("".join(_java_argument(a) + "\n" for a in ("kafka.tools.StorageTool", "format", "-t", cluster[-1],
                                                                "-c", str(properties), "-g", *scram)))
        try:
            done = subprocess.run([java, "-Xmx512m", log4j, "-cp", f"{lib}/*", f"@{arguments}"],
                                  capture_output=True, text=True, check=False, umask=0o077)
        finally:
            arguments.unlink()
        if done.returncode != 0:
            raise PipelineError(f"formatting Kafka storage in {self.data_dir} failed: {(done.stdout + done.stderr)[-1500:]}")

    def start(self, timeout: float = 90.0) -> str:
        """Start the broker; returns its bootstrap address once it serves."""
        lib = ensure_kafka_jars()
        last_error = ""
        # A folder that served before keeps its ports while they are free, so
        # a pinned DSH_KAFKA_BOOTSTRAP and running clients outlive a restart.
        ports = self._previous_ports()
        if self.port is not None and ports_if_free([self.port]) is None:
            raise PipelineError(f"127.0.0.1:{self.port} is in use: the broker needs another port")
        for _ in range(3):  # a port taken between probe and bind: try new ports
            fresh = free_ports(3)
            port, controller = ports or fresh[:2]
            if self.port is not None:
                port, controller = self.port, fresh[1]
            ports = None
            secured_port = fresh[2] if self.security.protocol and self.security.admin is None else None
            state = self.launch(lib, port, controller, secured_port)
            outcome = self.wait_ready(state, time.monotonic() + timeout)
            if outcome is None:
                return state.bootstrap
            last_error = outcome
            self._terminate()
            if "BindException" not in outcome or self.port is not None:  # a pinned port is not swapped for another
                break
        raise PipelineError(f"Kafka broker did not start: {last_error}")

    def launch(self, lib: Path, port: int, controller: int, secured_port: int | None = None) -> BrokerState:
        """Write the configuration, format the storage once and start the
        broker process; :meth:`wait_ready` then waits until it serves."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data_dir.chmod(0o700)  # topics, users' credentials and keys: the owner's only
        properties = self._write_config(port, controller, secured_port)
        self._format(lib, properties)
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self._log_start = log.tell()  # a restart appends: only this run's lines say it started
            popen = partial(subprocess.Popen, self._command(lib, properties), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent if self.attached else None,
                            start_new_session=not self.attached, umask=0o077)
            self.process = _LAUNCHER.submit(popen).result() if self.attached else popen()
        bootstrap = f"127.0.0.1:{port}"
        secured = bootstrap if self.security.admin is not None else f"127.0.0.1:{secured_port}" if secured_port else None
        return BrokerState(self.process.pid, bootstrap, str(self.data_dir), str(self.log_path), secured,
                           self.security.admin_settings())

    def wait_ready(self, state: BrokerState, deadline: float) -> str | None:
        """Wait until the launched broker serves (None; its state recorded)
        or the deadline passes (why not, the log's tail)."""
        outcome = self._wait_ready(state.client(), deadline)
        if outcome is None:
            self.bootstrap, self.secured_bootstrap = state.bootstrap, state.secured_bootstrap
            if not self.attached:
                private_file(_state_file(self.data_dir), json.dumps(state.__dict__))
        return outcome

    def admin_config(self, client_id: str = "dsh-pipeline-kafka-admin") -> KafkaConfig:
        """How the broker's own work reaches it once started: as the admin user, if it has one."""
        assert self.bootstrap is not None, "the broker has not started"
        return replace(KafkaConfig.from_env(self.bootstrap, self.security.admin_settings() or {}), client_id=client_id)

    def _wait_ready(self, client: KafkaConfig, deadline: float) -> str | None:
        """None when serving, else why not (the log's tail)."""
        assert self.process is not None
        started = False
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                return f"exited with code {code}; log {self.log_path}:\n{self._log_tail()}"
            if not started:
                started = _READY_LINE.encode() in self.log_path.read_bytes()[self._log_start:]
            if started and probe_metadata(client):
                return None
            time.sleep(0.2)  # wait-ok: polling a child process with a deadline
        return f"not serving within the deadline; log {self.log_path}:\n{self._log_tail()}"

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return "(no log)"

    def _terminate(self, grace: float = 30.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def stop(self) -> None:
        """Stop the broker (idempotent); a temporary data dir is removed."""
        self._terminate()
        self.process = None
        if self._temporary:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "LocalKafka":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def stop_detached(data_dir: Path, grace: float = 30.0) -> bool:
    """Stop a broker started detached in ``data_dir``; False if none ran."""
    state = read_state(data_dir)
    if state is None or not _alive(state.pid):
        _state_file(data_dir).unlink(missing_ok=True)
        return False
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(state.pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # wait-ok: polling a foreign pid with a deadline
        _reap(state.pid)
    if _alive(state.pid):
        os.kill(state.pid, signal.SIGKILL)
    _state_file(data_dir).unlink(missing_ok=True)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass

