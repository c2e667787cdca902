"""A test model upstream whose every answer is chosen by the request: the
body's ``"scenario"`` (a field no model API has; the normalized form
ignores it) picks a fixed byte sequence, so a test can compare what a
client receives through the gateway with what the upstream wrote.

Scenarios: ``sse`` (a Messages event stream in many small writes),
``error`` (HTTP 500 with a JSON error), ``stall`` (the first events, then
silence until the client goes), ``reset`` (the first events, then the
connection is dropped mid-chunk), ``gzip`` (a gzip-encoded JSON body),
``refuse`` (HTTP 401, as to a wrong API key). Every request's path, headers
and body are kept (a body over 1 MiB as its size only).
"""

from __future__ import annotations

import asyncio
import gzip
import json
from dataclasses import dataclass, field
from typing import Any

from tests.local_endpoint import LocalEndpoint

__all__ = ["SSE_EVENTS", "WireUpstream", "sse_bytes"]

SSE_EVENTS = [{"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": []}}] + [
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"piece {i} é ✓ "}}
    for i in range(40)] + [{"type": "message_stop"}]


def sse_bytes() -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in SSE_EVENTS)


@dataclass
class WireUpstream(LocalEndpoint):
    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await self._one(reader, writer):  # keep-alive: requests follow on one connection
            pass
        writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request_line = await reader.readline()
        if not request_line:
            return False
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        try:
            body = json.loads(raw) if len(raw) <= 1 << 20 else {"bytes": len(raw)}
        except ValueError:
            body = {"unparsed": raw.decode(errors="replace")}
        self.paths.append(request_line.split(b" ")[1].decode())
        self.received.append((headers, body))
        scenario = body.get("scenario", "sse")
        if scenario in ("error", "refuse"):
            status, message = ("500 Internal Server Error", "upstream says no") if scenario == "error" else (
                "401 Unauthorized", "invalid API key")
            payload = json.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
            writer.write(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(payload)}\r\n\r\n{payload}".encode())
            await writer.drain()
            return True
        if scenario == "gzip":
            payload = gzip.compress(json.dumps({"ok": True}).encode(), mtime=0)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                         + f"content-length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        data = sse_bytes()
        pieces = [data[i:i + 97] for i in range(0, len(data), 97)]
        if scenario in ("stall", "reset"):
            pieces = pieces[:3]
        for piece in pieces:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
        if scenario == "stall":
            await reader.read()  # until the gateway gives up on us
            return False
        if scenario == "reset":
            writer.write(b"ff\r\npartial")  # a chunk announced and never finished
            await writer.drain()
            writer.transport.abort()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
