"""The listeners' limits over real sockets against real servers (uvicorn
on the loopback): the operations port and the read API cut off a silent
client and a header sent a line at a time, close idle keep-alive
connections, refuse an oversized head, and answer ``/healthz`` while
hundreds of idle connections are held open, in a real ``serve`` with a
lowered open-file limit too."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry

from dsh_pipeline.ops_server import OPS_LIMITS, OpsServer, serve_ops
from dsh_pipeline.web import read_api
from dsh_pipeline.web.app import API_LIMITS
from producers import http_limits
from producers.http_limits import ListenerLimits
from tests.fake_reader import FakeReader
from tests.view_store_helpers import stored_fleet
from tests.waiting import wait_for

HOST = "127.0.0.1"
QUICK = ListenerLimits(request_seconds=1.0, idle_seconds=1, max_connections=64, max_head_bytes=4096)
SLACK = 5.0  # seconds a cut-off may take beyond its limit on a loaded machine


def _ops(limits: ListenerLimits = OPS_LIMITS) -> OpsServer:
    return serve_ops(HOST, 0, lambda: (True, "ok"), CollectorRegistry(), limits)


def _api(limits: ListenerLimits = API_LIMITS) -> OpsServer:
    """The read API in a thread of its own, as ``serve`` runs it."""
    return OpsServer(read_api(FakeReader([]), frozenset({"token"})), HOST, 0, limits)


SERVERS = {"ops": _ops, "api": _api}


def _closed_within(connection: socket.socket, seconds: float, send_each: bytes = b"") -> float:
    """Seconds until the server closes ``connection`` (sending ``send_each``
    every 0.2 s meanwhile); fails after ``seconds``."""
    start = time.monotonic()
    connection.settimeout(0.2)
    while time.monotonic() - start < seconds:
        if send_each:
            try:
                connection.sendall(send_each)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start
        try:
            if connection.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
    raise AssertionError(f"the server kept the connection open for {seconds} s")


def _health(port: int, timeout: float = 5.0) -> bytes:
    """The status line of ``GET /healthz`` on a new connection."""
    with socket.create_connection((HOST, port), timeout=timeout) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: ops\r\nConnection: close\r\n\r\n")
        answer = b""
        while b"\r\n" not in answer:
            chunk = connection.recv(4096)
            assert chunk, "closed before answering"
            answer += chunk
        return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_a_silent_connection_is_closed(server):
    with SERVERS[server](QUICK) as served, socket.create_connection((HOST, served.port)) as silent:
        assert QUICK.request_seconds * 0.5 <= _closed_within(silent, QUICK.request_seconds + SLACK)


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_a_header_sent_a_line_at_a_time_is_cut_off(server):
    with SERVERS[server](QUICK) as served, socket.create_connection((HOST, served.port)) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: ops\r\n")
        assert _closed_within(slow, QUICK.request_seconds + SLACK, send_each=b"X-Slow: 1\r\n") < \
            QUICK.request_seconds + SLACK


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_an_idle_keep_alive_connection_is_closed(server):
    with SERVERS[server](QUICK) as served, socket.create_connection((HOST, served.port)) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: ops\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200 ")
        _closed_within(kept, QUICK.idle_seconds + SLACK)


def _whole_response(connection: socket.socket) -> bytes:
    """One chunked response read to its last chunk (``/healthz`` answers so)."""
    answer = b""
    while not answer.endswith(b"\r\n0\r\n\r\n"):
        chunk = connection.recv(4096)
        assert chunk, f"closed before the response ended: {answer!r}"
        answer += chunk
    return answer


def test_an_idle_keep_alive_connection_waits_its_idle_time_and_its_next_head_is_still_timed():
    limits = ListenerLimits(request_seconds=1.0, idle_seconds=6, max_connections=64, max_head_bytes=4096)
    request = b"GET /healthz HTTP/1.1\r\nHost: ops\r\n\r\n"
    with _ops(limits) as served, socket.create_connection((HOST, served.port)) as kept:
        kept.sendall(request)
        assert _whole_response(kept).startswith(b"HTTP/1.1 200 ")
        kept.settimeout(limits.request_seconds + 1.0)
        with pytest.raises(TimeoutError):  # wait-ok: open past the head deadline, idle within its idle time
            kept.recv(1)
        kept.sendall(request)
        assert _whole_response(kept).startswith(b"HTTP/1.1 200 "), "the kept-alive connection served its next request"
        kept.sendall(request[:20])  # the next head begins and stalls: cut off by its own deadline, not the idle time
        assert _closed_within(kept, limits.request_seconds + SLACK) < limits.request_seconds + SLACK


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_an_oversized_head_is_refused(server):
    with SERVERS[server](QUICK) as served, socket.create_connection((HOST, served.port), timeout=10) as large:
        try:
            large.sendall(b"GET /healthz HTTP/1.1\r\nHost: ops\r\nX-Big: " + b"a" * (2 * QUICK.max_head_bytes))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert large.recv(4096).startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_healthz_answers_while_300_idle_connections_are_open(server):
    with SERVERS[server]({"ops": OPS_LIMITS, "api": ListenerLimits(max_connections=100)}[server]) as served:
        held = [socket.create_connection((HOST, served.port)) for _ in range(300)]
        try:
            held[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: ops\r\n")  # and one half-sent head
            start = time.monotonic()
            assert _health(served.port).endswith(b" 200 OK")
            assert time.monotonic() - start < 5.0
        finally:
            for connection in held:
                connection.close()


def test_the_connection_bound_stays_within_a_quarter_of_the_open_file_limit(monkeypatch):
    monkeypatch.setattr(http_limits.resource, "getrlimit", lambda which: (256, 4096))
    assert ListenerLimits(max_connections=512).connection_bound() == 64
    assert ListenerLimits(max_connections=32).connection_bound() == 32


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def test_serve_answers_healthz_on_both_ports_with_300_idle_connections_each_under_256_open_files(tmp_path):
    store = tmp_path / "views.sqlite"
    stored_fleet(store, count=2)
    tokens = tmp_path / "tokens"
    tokens.write_text("token\n")
    tokens.chmod(0o600)
    api, ops = _free_port(), _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        serving = subprocess.Popen(
            [sys.executable, "-m", "dsh_pipeline.cli", "serve", "--store", str(store), "--tokens-file", str(tokens),
             "--listen", f"{HOST}:{api}", "--metrics-port", str(ops)],
            stderr=stderr, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
    held: list[socket.socket] = []
    try:
        wait_for(lambda: "dsh-pipeline serve: http://" in log.read_text() or serving.poll() is not None, 60,
                 "serve to listen on both ports")
        assert serving.poll() is None, log.read_text()
        for port in (api, ops):
            held += [socket.create_connection((HOST, port)) for _ in range(300)]
            assert _health(port).endswith(b" 200 OK"), port
        assert serving.poll() is None
    finally:
        for connection in held:
            connection.close()
        serving.terminate()
        serving.wait(30)
