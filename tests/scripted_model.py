"""A scripted, local OpenAI-style chat-completions endpoint for real dsh agents.

Each agent's first user message names its script (``[script:NAME#ID]``); the
endpoint answers that session's requests in order from the script. Every
request body is kept, so a test can compare what dsh sent the model with
the requests rebuilt from the log. The replies, scripts and chunk streams
are :mod:`dsh_pipeline.scripted_chat`'s (the demo's packaged ASGI model);
this endpoint's HTTP is hand-written so tests can tap and replay its bytes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from dsh_pipeline.scripted_chat import SCRIPTS, Reply, _pieces, _stream, script_tag
from tests.local_endpoint import LocalEndpoint

__all__ = ["Reply", "SCRIPTS", "ScriptedModel", "_pieces", "_stream"]


@dataclass
class _Session:
    script: list[Reply]
    served: int = 0


@dataclass
class ScriptedModel(LocalEndpoint):
    """Runs on its own thread and event loop; ``url`` once started.
    ``scripts`` are :data:`SCRIPTS` unless given."""

    scripts: dict[str, list[Reply]] = field(default_factory=lambda: dict(SCRIPTS))
    requests: list[dict[str, Any]] = field(default_factory=list)
    _sessions: dict[str, _Session] = field(default_factory=dict)


    def _script_of(self, body: dict[str, Any]) -> _Session:
        name, instance = script_tag(body)
        return self._sessions.setdefault(f"{name}#{instance}", _Session(self.scripts[name]))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await reader.readline()
            headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                key, _, value = line.decode().partition(":")
                headers[key.strip().lower()] = value.strip()
            if b"/chat/completions" not in request_line:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return
            body = json.loads(await _read_body(reader, headers))
            self.requests.append(body)
            session = self._script_of(body)
            reply = session.script[min(session.served, len(session.script) - 1)]
            session.served += 1
            if reply.status != 200:
                payload = json.dumps({"error": {"message": reply.error, "type": "server_error"}}).encode()
                writer.write(f"HTTP/1.1 {reply.status} Error\r\ncontent-type: application/json\r\n"
                             f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode() + payload)
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                         b"connection: close\r\n\r\n")
            chunks = _stream(reply, body.get("model", "model"))
            if reply.hang:  # the text so far, then nothing until the caller disconnects
                chunks = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
            for chunk in chunks:
                writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if reply.hang:
                await writer.drain()
                await reader.read()
                return
            writer.write(b"data: [DONE]\n\n")
        finally:
            await writer.drain()
            writer.close()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", ""):
        body = b""
        while True:
            size = int((await reader.readline()).strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return body
            body += await reader.readexactly(size)
            await reader.readline()
    return await reader.readexactly(int(headers.get("content-length", "0")))

