"""The gateway benchmark's floor: a pass-through proxy on the gateway's own
HTTP stack (uvicorn through :class:`~producers.asgi_server.AsgiServer`,
aiohttp upstream, uvloop) that forwards and relays and does nothing else:
no attestation, no header filtering, no disconnect watcher, no metrics.

    python -m benchmarks.bare_relay PORT UPSTREAM_URL
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Callable

import aiohttp

from dsh_pipeline.runtime import run_until_signal
from producers.asgi_server import AsgiServer


class BareRelay:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if self.client is None:
            self.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k not in (b"host", b"content-length")]
        async with self.client.request(scope["method"], self.upstream + scope["path"], data=body,
                                       headers=headers) as response:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(k, v) for k, v in response.raw_headers if k.lower() != b"transfer-encoding"]})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()


def main(port: int, upstream: str) -> int:
    async def serve(stop: asyncio.Event) -> int:
        async with AsgiServer(BareRelay(upstream), "the bare relay", port=port):
            await stop.wait()
        return 0
    return run_until_signal(serve)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
