"""The operations port of a long-running service: ``/metrics``, ``/healthz`` and ``/livez``.

One small ASGI app, served by uvicorn (:class:`~producers.asgi_server.AsgiServer`)
on an event loop of its own in a daemon thread, so a slow scrape never
stalls the service's event loop and the service's work never delays a
probe. The listener keeps :data:`OPS_LIMITS` (:mod:`producers.http_limits`):
a request must arrive within seconds of the connection being ready for it,
idle connections close, and at most so many are open, the idle ones shed
first, so ``/healthz`` answers while hundreds of idle or half-sent
connections are held open (a thread per connection, as the standard
library's server had, is what they exhausted).

* ``/metrics`` is prometheus_client's own app (content negotiation, gzip,
  ``name[]`` filters), over the given registry;
* ``/healthz`` (readiness) asks the caller's :data:`HealthCheck`: 200 and
  its detail when healthy, 503 and its detail otherwise (a check that
  raises is unhealthy);
* ``/livez`` (liveness) is 200 while the process serves at all: a broker
  outage makes a service unready, and restarting it would not help;
* every other path is 404; a method but ``GET`` and ``HEAD`` is 405.

:func:`serve_ops` binds before it returns, so a port in use or a host that
cannot be bound is a :class:`~dsh_core.errors.PipelineError` naming
``host:port`` and the reason, at start-up rather than later in a thread.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from typing import Awaitable, Callable, Mapping, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app

from producers.asgi_server import AsgiServer
from producers.http_limits import ListenerLimits

__all__ = ["HealthCheck", "OPS_LIMITS", "OpsServer", "Polled", "consumers_health", "serve_ops"]

#: ``() -> (ok, detail)``; called once per ``/healthz`` request, from the server's thread.
HealthCheck = Callable[[], tuple[bool, str]]
#: What an operations port holds its clients to: probes and scrapes are small and quick.
OPS_LIMITS = ListenerLimits(request_seconds=10.0, idle_seconds=5, max_connections=64, max_head_bytes=16 * 1024)

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
_App = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class Polled(Protocol):
    """What the consumers' health check reads of a service
    (:class:`~consumers.runtime.GroupMember`)."""

    last_poll: float  # time.monotonic() of its last poll

    @property
    def state(self) -> enum.Enum:
        """Its state; ``running`` (by value) is the only healthy one."""

    def silences(self) -> dict[str, float]:
        """Seconds since the cluster last answered, per assigned partition."""

    def assigning_for(self) -> float | None:
        """Seconds its running assignment step has taken (``None``: none runs)."""


def consumers_health(services: Mapping[str, Polled], stale_after: float = 60.0,
                     clock: Callable[[], float] = time.monotonic) -> HealthCheck:
    """Healthy while every service (by name) is running, in no assignment
    step for ``stale_after`` seconds or more, polled within the last
    ``stale_after`` seconds of ``clock`` and heard from the cluster within as
    long for every partition assigned to it (a stopped broker, or one
    leading a partition, makes it unhealthy; the detail names the
    partitions); none at all is unhealthy."""
    def check() -> tuple[bool, str]:
        if not services:
            return False, "no service running"
        now = clock()
        problems = []
        for name, service in list(services.items()):  # one copy: the command adds its members meanwhile
            state = service.state.value
            if state != "running":
                problems.append(f"{name}: {state}, not running")
            elif (assigning := service.assigning_for()) is not None and assigning >= stale_after:
                problems.append(f"{name}: taking partitions for {assigning:.1f} s (rebuilding their state or waiting "
                                f"for the cluster's offsets; stale after {stale_after:g} s)")
            elif now - service.last_poll >= stale_after:
                problems.append(f"{name}: last poll {now - service.last_poll:.1f} s ago (stale after {stale_after:g} s)")
            elif silent := sorted((partition, seconds) for partition, seconds in service.silences().items()
                                  if seconds >= stale_after):
                listed = ", ".join(f"{partition} for {seconds:.1f} s" for partition, seconds in silent)
                problems.append(f"{name}: no answer from the cluster for {listed} (stale after {stale_after:g} s)")
        return (False, "; ".join(problems)) if problems else (True, "ok")
    return check


def _health_app(check: HealthCheck) -> _App:
    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        try:
            ok, detail = check()
        except Exception as error:  # the check's failure is the answer, not a 500 with a traceback
            ok, detail = False, f"health check failed: {type(error).__name__}: {error}"
        await _answer(send, 200 if ok else 503, detail)
    return app


async def _answer(send: Callable, status: int, text: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [*_TEXT, *headers]})
    await send({"type": "http.response.body", "body": text.encode("utf-8") + b"\n"})


class OpsServer:
    """An ASGI app served on an event loop of its own, in a daemon thread
    (the operations port's app, by :func:`serve_ops`); :meth:`close` (or
    leaving the ``with`` block) stops it and releases the port."""

    def __init__(self, app: _App, host: str, port: int, limits: ListenerLimits) -> None:
        self.host, self.port = host, port
        self._closed = False
        self._started = threading.Event()
        self._failed: Exception | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(app, limits),),
                                        name=f"ops-server:{host}:{port}", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failed is not None:
            self._thread.join()
            raise self._failed

    async def _serve(self, app: _App, limits: ListenerLimits) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with AsgiServer(app, "the operations port (/metrics, /healthz)", self.host, self.port,
                                  limits) as server:
                self.port = server.bound_port
                self._started.set()
                await self._stop.wait()
        except Exception as error:
            if self._started.is_set():  # while serving: the thread's own failure, reported as such
                raise
            self._failed = error  # while starting: the caller's, raised there
        finally:
            self._started.set()

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def __enter__(self) -> "OpsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<OpsServer {self.host}:{self.port}{' closed' if self._closed else ''}>"


def serve_ops(host: str, port: int, health: HealthCheck, registry: CollectorRegistry = REGISTRY,
              limits: ListenerLimits = OPS_LIMITS) -> OpsServer:
    """Serve ``/metrics`` (``registry``) and ``/healthz`` (``health``) on
    ``host:port`` (port 0: any free port, see :attr:`OpsServer.port`)."""
    routes = {"/metrics": make_asgi_app(registry), "/healthz": _health_app(health),
              "/livez": _health_app(lambda: (True, "alive"))}

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, "use GET", ((b"allow", b"GET, HEAD"),))
        elif (route := routes.get(scope["path"])) is None:
            await _answer(send, 404, "not found; try /metrics, /healthz or /livez")
        else:
            await route(scope, receive, send)

    return OpsServer(app, host, port, limits)
