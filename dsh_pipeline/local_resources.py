"""What the local servers (the Kafka broker and cluster, PostgreSQL) take from
this host: free loopback ports, chosen together or checked again on restart,
and files only their owner may read (0600) for configurations and secrets."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

__all__ = ["free_ports", "ports_if_free", "private_file"]


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (each probe stays bound until all are
    chosen: probes released one by one may be given the same port)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def ports_if_free(ports: list[int]) -> list[int] | None:
    """``ports`` if each can be bound on loopback now, else ``None``. Like
    the broker's own listeners, the probe ignores connections of a previous
    run still in TIME_WAIT on the port."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            probe = stack.enter_context(socket.socket())
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return None
    return ports


def private_file(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, a file only its owner may read or write (0600)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    os.chmod(path, 0o600)  # a file that existed keeps its mode through O_CREAT
    return path
