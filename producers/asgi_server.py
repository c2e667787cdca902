"""Serving an ASGI app (the gateway, the read API, the operations port, the
demo's scripted model) with uvicorn on a socket bound before the server
starts, within limits a slow or crowded client cannot outlast
(:mod:`producers.http_limits`)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from dsh_core.errors import PipelineError

from .http_limits import ListenerLimits, limited_protocol

__all__ = ["AsgiServer"]


class AsgiServer:
    """Serves an ASGI app with uvicorn on ``host:port`` (0: a free port)
    while in ``async with``; ``url`` once entered. The socket is bound and
    listening on entry, so clients may connect at once; a port that cannot
    be bound is a :class:`PipelineError` naming ``name`` and the port. On
    exit the app's ``aclose()``, if it has one, is awaited. Its connections
    are held to ``limits`` (:mod:`producers.http_limits`). A client's
    ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed only from
    the addresses in ``trusted_proxies`` (default none, unlike uvicorn,
    which believes any client on this host: another local user could
    then name any address, and slip past a per-address limit)."""

    def __init__(self, app: Any, name: str, host: str = "127.0.0.1", port: int = 0,
                 limits: ListenerLimits = ListenerLimits(), *, trusted_proxies: tuple[str, ...] = ()) -> None:
        self.app, self.name, self.host, self.port, self.limits = app, name, host, port, limits
        self.trusted_proxies = trusted_proxies
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "AsgiServer":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP; without it every
        # response waited on the client's delayed ACK (+40 ms time to first byte)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(1024)
        except OSError as error:
            sock.close()
            raise PipelineError(f"{self.name} cannot listen on {self.host}:{self.port}: {error.strerror or error}") \
                from error
        port = self.bound_port = sock.getsockname()[1]
        self.url = f"http://{'[' + self.host + ']' if family == socket.AF_INET6 else self.host}:{port}"
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, access_log=False,
                                proxy_headers=bool(self.trusted_proxies),
                                forwarded_allow_ips=list(self.trusted_proxies),
                                # no WebSocket upgrade: a connection handed over would leave the limits
                                http=limited_protocol(self.limits), ws="none",
                                timeout_keep_alive=self.limits.idle_seconds, timeout_graceful_shutdown=5, backlog=1024)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        try:
            await self._task
        finally:
            if hasattr(self.app, "aclose"):
                await self.app.aclose()
