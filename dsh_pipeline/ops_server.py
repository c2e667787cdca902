"""The operations port of a long-running service: ``/metrics``, ``/healthz`` and ``/livez``.

One small WSGI app, served by the standard library's ``wsgiref`` server in a
daemon thread (so a slow scrape never stalls the service's event loop):

* ``/metrics`` is prometheus_client's own app (content negotiation, gzip,
  ``name[]`` filters), over the given registry;
* ``/healthz`` (readiness) asks the caller's :data:`HealthCheck`: 200 and
  its detail when healthy, 503 and its detail otherwise (a check that
  raises is unhealthy);
* ``/livez`` (liveness) is 200 while the process serves at all: a broker
  outage makes a service unready, and restarting it would not help;
* every other path is 404.

:func:`serve_ops` binds before it returns, so a port in use or a host that
cannot be bound is a :class:`~dsh_core.errors.PipelineError` naming
``host:port`` and the reason, at start-up rather than later in a thread.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Iterable, Mapping, Protocol
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dsh_core.errors import PipelineError

__all__ = ["HealthCheck", "OpsServer", "Polled", "consumers_health", "serve_ops"]

#: ``() -> (ok, detail)``; called once per ``/healthz`` request, from the server's thread.
HealthCheck = Callable[[], tuple[bool, str]]

_TEXT = [("Content-Type", "text/plain; charset=utf-8")]
#: How often the serving thread looks for a shutdown request (bounds :meth:`OpsServer.close`).
_POLL_SECONDS = 0.1


class Polled(Protocol):
    """What the consumers' health check reads of a service."""

    healthy: bool
    last_poll: float  # time.monotonic() of its last poll

    def silent_for(self) -> float | None:
        """Seconds since the cluster last answered (``None``: cannot tell)."""


def consumers_health(services: Mapping[str, Polled], stale_after: float = 60.0,
                     clock: Callable[[], float] = time.monotonic) -> HealthCheck:
    """Healthy while every service (by name) is ``healthy``, polled within
    the last ``stale_after`` seconds of ``clock`` and heard from the cluster
    within as long (a stopped broker makes it unhealthy); none at all is
    unhealthy."""
    def check() -> tuple[bool, str]:
        if not services:
            return False, "no service running"
        now = clock()
        problems = []
        for name, service in services.items():
            silent = service.silent_for()
            if not service.healthy:
                problems.append(f"{name}: not running")
            elif now - service.last_poll >= stale_after:
                problems.append(f"{name}: last poll {now - service.last_poll:.1f} s ago (stale after {stale_after:g} s)")
            elif silent is not None and silent >= stale_after:
                problems.append(f"{name}: no answer from the cluster for {silent:.1f} s (stale after {stale_after:g} s)")
        return (False, "; ".join(problems)) if problems else (True, "ok")
    return check


def _health_app(check: HealthCheck) -> Callable:
    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [*_TEXT, ("Allow", "GET, HEAD")])
            return [b"use GET\n"]
        try:
            ok, detail = check()
        except Exception as error:  # the check's failure is the answer, not a 500 with a traceback
            ok, detail = False, f"health check failed: {type(error).__name__}: {error}"
        start_response("200 OK" if ok else "503 Service Unavailable", list(_TEXT))
        return [detail.encode("utf-8") + b"\n"]
    return app


def _not_found(environ: dict, start_response: Callable) -> Iterable[bytes]:
    start_response("404 Not Found", list(_TEXT))
    return [b"not found; try /metrics, /healthz or /livez\n"]


class _QuietHandler(WSGIRequestHandler):
    """No access log line on stderr per request (scrapes come every few seconds)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingWSGIServer):
    def __init__(self, address: tuple, family: socket.AddressFamily) -> None:
        self.address_family = family  # read by the socket set-up in TCPServer.__init__
        super().__init__(address, _QuietHandler)


class OpsServer:
    """A running operations server; :meth:`close` (or leaving the ``with``
    block) stops it and releases the port."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._closed = False
        self._thread = threading.Thread(target=server.serve_forever, args=(_POLL_SECONDS,),
                                        name=f"ops-server:{self.port}", daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return self._server.server_address[0]

    @property
    def port(self) -> int:
        """The bound port (the one the OS chose when asked for port 0)."""
        return self._server.server_address[1]

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._server.shutdown()
            self._thread.join()
        finally:
            self._server.server_close()

    def __enter__(self) -> "OpsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<OpsServer {self.host}:{self.port}{' closed' if self._closed else ''}>"


def serve_ops(host: str, port: int, health: HealthCheck, registry: CollectorRegistry = REGISTRY) -> OpsServer:
    """Serve ``/metrics`` (``registry``) and ``/healthz`` (``health``) on
    ``host:port`` (port 0: any free port, see :attr:`OpsServer.port`)."""
    routes = {"/metrics": make_wsgi_app(registry), "/healthz": _health_app(health),
              "/livez": _health_app(lambda: (True, "alive"))}

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        return routes.get(environ.get("PATH_INFO", ""), _not_found)(environ, start_response)

    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server = _Server(address, family)
    except OSError as error:
        raise PipelineError(f"cannot serve /metrics and /healthz on {host}:{port}: {error.strerror or error}") from None
    server.set_app(app)
    return OpsServer(server)
