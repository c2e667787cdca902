"""Serving an ASGI app (the gateway, the read API, the demo's scripted model)
with uvicorn on a socket bound before the server starts, within limits a
slow or crowded client cannot outlast: a request head must arrive within
``header_timeout`` of the connection opening or of its first byte (uvicorn
alone waits for ever), an idle keep-alive connection is closed after
``keep_alive`` seconds, and beyond ``max_connections`` open connections a
request is answered 503."""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dsh_core.errors import PipelineError

__all__ = ["AsgiServer"]


class _HeadWithinTimeout(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request head
    is not complete ``header_timeout`` seconds after the connection opened
    or the request's first byte arrived."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class AsgiServer:
    """Serves an ASGI app with uvicorn on ``host:port`` (0: a free port)
    while in ``async with``; ``url`` once entered. The socket is bound and
    listening on entry, so clients may connect at once; a port that cannot
    be bound is a :class:`PipelineError` naming ``name`` and the port. On
    exit the app's ``aclose()``, if it has one, is awaited."""

    def __init__(self, app: Any, name: str, host: str = "127.0.0.1", port: int = 0, *, header_timeout: float = 10.0,
                 keep_alive: float = 75.0, max_connections: int = 1024) -> None:
        self.app, self.name, self.host, self.port = app, name, host, port
        self.header_timeout, self.keep_alive, self.max_connections = header_timeout, keep_alive, max_connections
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
        port = sock.getsockname()[1]
        self.url = f"http://{'[' + self.host + ']' if family == socket.AF_INET6 else self.host}:{port}"
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, access_log=False,
                                http=functools.partial(_HeadWithinTimeout, header_timeout=self.header_timeout),
                                timeout_keep_alive=self.keep_alive, limit_concurrency=self.max_connections,
                                timeout_graceful_shutdown=5, backlog=1024)
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
