"""A local HTTP test endpoint on its own thread and event loop (asyncio streams).

Subclasses implement ``_handle(reader, writer)``; ``with Endpoint() as e``
starts it on a free loopback port (``e.url``) and stops it on exit, closing
the connections still open (a client's pooled keep-alive connections) and
their handlers before its loop ends, so no socket outlives it.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["LocalEndpoint"]


class LocalEndpoint:
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.AbstractServer | None = None
    _thread: threading.Thread | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            await self._handle(reader, writer)
        finally:
            self._open.discard(writer)

    async def _shut_down(self) -> None:
        """Close the listener and every open connection; the handlers then
        read their end of stream and return (one that does not within 5 s
        is cancelled)."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._open):
            writer.close()
        handlers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if handlers:
            _, stuck = await asyncio.wait(handlers, timeout=5)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        await self._server.wait_closed()

    def __enter__(self):
        self._open: set[asyncio.StreamWriter] = set()
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._shut_down())
            self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._loop is not None and self._server is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
