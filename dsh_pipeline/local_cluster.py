"""A real Kafka (KRaft) cluster of several nodes on loopback, from the same jars
as :class:`~dsh_pipeline.local_kafka.LocalKafka`.

Each node is a combined broker and controller with its own folder
(``node-1``, ``node-2``, ...) and its own ports; the nodes form one controller
quorum. The cluster keeps three copies (at most one per node) of its internal
topics and of topics created without a replication factor, and all but one
copy must acknowledge a write, so it serves through the loss of any one node.

Tests stop, kill, pause and resume single nodes (:meth:`LocalCluster.kill`,
:meth:`~LocalCluster.start_node`, :meth:`~LocalCluster.restart_node`, :meth:`~LocalCluster.pause`,
:meth:`~LocalCluster.resume`); ``dsh-pipeline kafka start --nodes N`` runs one
detached, recording every node's state beside its own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Coroutine

from dsh_core.errors import PipelineError
from dsh_kafka.clients import make_admin
from dsh_kafka.config import KafkaConfig
from dsh_pipeline.kafka_jars import ensure_kafka_jars
from dsh_pipeline.local_kafka import (BrokerState, ClusterNode, LocalKafka, read_state, stop_detached,
                                      sweep_abandoned_data_dirs)
from dsh_pipeline.local_resources import free_ports, ports_if_free, private_file

__all__ = ["LocalCluster", "cluster_nodes", "stop_detached_cluster"]

_CLUSTER_FILE = "cluster.json"
#: A node's line on becoming the metadata quorum's leader, the active controller (QuorumState, INFO).
_LEADER_LINE = re.compile(r"Completed transition to Leader\w*\(.*?\bepoch=(\d+)")
_LISTENERS = re.compile(r"^listeners=PLAINTEXT://127\.0\.0\.1:(\d+),CONTROLLER://127\.0\.0\.1:(\d+)", re.MULTILINE)


def cluster_nodes(data_dir: Path) -> list[Path] | None:
    """The node folders of the cluster kept in ``data_dir``; ``None``: it holds no cluster."""
    try:
        return [Path(folder) for folder in json.loads((data_dir / _CLUSTER_FILE).read_text())["nodes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cluster_id() -> str:
    """A new cluster id as Kafka makes one (``Uuid.randomUuid``): never one
    starting with "-", which its storage tool would read as an option."""
    while (found := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return found


class LocalCluster:
    """``size`` broker-and-controller nodes; use as a context manager, or
    start/stop by hand. ``data_dir`` None means a temporary folder removed at
    stop; a given folder keeps the cluster (its id, topics and ports) across
    restarts. ``attached`` nodes die with their parent process."""

    def __init__(self, size: int = 3, data_dir: Path | None = None, *, attached: bool = True,
                 heap: str = "512m") -> None:
        if size < 1:
            raise PipelineError(f"a cluster needs at least one node, got --nodes {size}")
        self._temporary = data_dir is None
        if data_dir is None:
            sweep_abandoned_data_dirs()
            data_dir = Path(tempfile.mkdtemp(prefix="dsh-kafka-"))
            if attached:
                (data_dir / "owner.pid").write_text(str(os.getpid()))
        self.data_dir = Path(data_dir)
        self.size = size
        self.attached = attached
        self.heap = heap
        self.nodes: dict[int, LocalKafka] = {}
        self._states: dict[int, BrokerState] = {}

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(state.bootstrap for _, state in sorted(self._states.items()))

    def node_bootstrap(self, node: int) -> str:
        return self._states[node].bootstrap

    def _ports(self) -> list[tuple[int, int]]:
        """(client, controller) port of each node: the folder's last ones while all are free, else new ones."""
        previous = []
        for node in range(1, self.size + 1):
            properties = self.data_dir / f"node-{node}" / "server.properties"
            found = _LISTENERS.search(properties.read_text()) if properties.exists() else None
            if found is None:
                break
            previous.append((int(found[1]), int(found[2])))
        if len(previous) == self.size and ports_if_free([port for pair in previous for port in pair]):
            return previous
        fresh = free_ports(2 * self.size)
        return list(zip(fresh[::2], fresh[1::2]))

    def start(self, timeout: float = 120.0) -> str:
        """Start every node; returns the bootstrap addresses once each serves."""
        if (self.data_dir / "logs").exists() or (self.data_dir / "secrets").exists():
            raise PipelineError(f"{self.data_dir} holds a single broker: give the cluster another --data-dir")
        lib = ensure_kafka_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.data_dir.chmod(0o700)
        ports = self._ports()
        voters = ",".join(f"{node}@127.0.0.1:{controller}" for node, (_, controller) in enumerate(ports, 1))
        cluster_id = _cluster_id()
        replicas = min(3, self.size)
        for node, (port, controller) in enumerate(ports, 1):
            broker = LocalKafka(self.data_dir / f"node-{node}", attached=self.attached, heap=self.heap,
                                node=ClusterNode(node, voters, replicas, cluster_id))
            self.nodes[node] = broker
            self._states[node] = broker.launch(lib, port, controller)
        deadline = time.monotonic() + timeout
        for node, broker in self.nodes.items():  # the quorum forms once the nodes run together
            outcome = broker.wait_ready(self._states[node], deadline)
            if outcome is not None:
                self.stop()
                raise PipelineError(f"Kafka node {node} of {self.data_dir} did not start: {outcome}")
        if not self.attached:
            first = self._states[1]
            private_file(self.data_dir / _CLUSTER_FILE, json.dumps({"nodes": [str(b.data_dir) for b in self.nodes.values()]}))
            private_file(self.data_dir / "broker-state.json", json.dumps(
                BrokerState(first.pid, self.bootstrap, str(self.data_dir), first.log).__dict__))
        return self.bootstrap

    def running(self, node: int) -> bool:
        """Whether ``node``'s process runs (a paused one does)."""
        process = self.nodes[node].process
        return process is not None and process.poll() is None

    def _process(self, node: int) -> subprocess.Popen:
        process = self.nodes[node].process
        if process is None:
            raise PipelineError(f"Kafka node {node} is not running")
        return process

    def kill(self, node: int) -> None:
        """End ``node`` at once (SIGKILL: no controlled shutdown)."""
        process = self._process(node)
        process.kill()
        process.wait(30)

    def stop_node(self, node: int) -> None:
        """Stop ``node`` (controlled shutdown: its partitions' leadership moves first)."""
        self.nodes[node].stop()

    def start_node(self, node: int, timeout: float = 90.0) -> None:
        """Start ``node`` again on its own ports and folder; returns once it serves."""
        broker, state = self.nodes[node], self._states[node]
        if self.running(node):
            return
        port, controller = (int(part) for part in _LISTENERS.search(
            (broker.data_dir / "server.properties").read_text()).groups())  # type: ignore[union-attr]
        self._states[node] = state = broker.launch(ensure_kafka_jars(), port, controller)
        outcome = broker.wait_ready(state, time.monotonic() + timeout)
        if outcome is not None:
            raise PipelineError(f"Kafka node {node} did not start again: {outcome}")

    def restart_node(self, node: int, timeout: float = 180.0) -> None:
        """A rolling restart's step: stop ``node`` (controlled shutdown),
        start it, and return once it serves and its copy of every partition
        it holds is in sync again. Serving is not enough: a node back but
        still catching up leaves a partition with one copy in sync when the
        next node stops, and writes to it wait until one catches up."""
        deadline = time.monotonic() + timeout
        self.stop_node(node)
        self.start_node(node, deadline - time.monotonic())
        self.wait_in_sync(node, deadline)

    def wait_in_sync(self, node: int, deadline: float) -> None:
        """Wait until ``node`` is in the in-sync replicas of every partition
        it holds a copy of (``deadline``: :func:`time.monotonic`)."""
        while (behind := _apart(_behind(self.bootstrap, node))) != []:
            if time.monotonic() > deadline:
                raise PipelineError(f"Kafka node {node}'s copies of {', '.join(behind or ['(no answer)'])} were not "
                                    "in sync by the deadline")
            time.sleep(0.2)  # wait-ok: polling the cluster's metadata with a deadline

    def controller(self) -> int:
        """The active controller: the node that became the quorum's leader
        at the highest epoch (each node logs its own transitions)."""
        epochs = {}
        for node, broker in self.nodes.items():
            log = broker.data_dir / "broker.log"
            found = _LEADER_LINE.findall(log.read_text(errors="replace")) if log.exists() else []
            if found:
                epochs[node] = max(map(int, found))
        if not epochs:
            raise PipelineError(f"no node of {self.data_dir} has become the active controller yet")
        return max(epochs, key=epochs.__getitem__)

    def pause(self, node: int) -> None:
        """Freeze ``node`` (SIGSTOP): its connections stay open but nothing answers."""
        self._process(node).send_signal(signal.SIGSTOP)

    def resume(self, node: int) -> None:
        self._process(node).send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop every node (idempotent); a temporary data dir is removed."""
        for node, broker in self.nodes.items():
            if self.running(node):  # all at once: the last nodes would wait for a quorum that has left
                self.resume(node)  # a paused node cannot take its SIGTERM
                broker.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for broker in self.nodes.values():
            broker.stop()
        if self._temporary:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def _behind(bootstrap: str, node: int) -> list[str]:
    """The partitions of which ``node`` holds a copy not in sync."""
    admin = make_admin(KafkaConfig(bootstrap), request_timeout_ms=5000)
    await admin.start()
    try:
        topics = await admin.describe_topics()
    finally:
        await admin.close()
    return [f"{topic['topic']}[{partition['partition']}]" for topic in topics for partition in topic["partitions"]
            if node in partition["replicas"] and node not in partition["isr"]]


def _apart(work: Coroutine[Any, Any, list[str]]) -> list[str] | None:
    """``work``'s answer, run on its own loop and thread (the caller may
    be inside one); ``None`` if it failed or took over 15 s."""
    answer: list[list[str]] = []

    def run() -> None:
        with contextlib.suppress(Exception):  # any failure means "no answer yet"
            answer.append(asyncio.run(asyncio.wait_for(work, 15)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    return answer[0] if answer else None


def stop_detached_cluster(data_dir: Path) -> bool:
    """Stop every node of the detached cluster in ``data_dir``; False if none ran."""
    folders = cluster_nodes(data_dir) or []
    for state in filter(None, map(read_state, folders)):  # all at once, as LocalCluster.stop does
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pid, signal.SIGTERM)
    stopped = [stop_detached(folder) for folder in folders]
    (data_dir / "broker-state.json").unlink(missing_ok=True)
    return any(stopped)
