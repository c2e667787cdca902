"""A scripted, local OpenAI-style chat-completions endpoint for real dsh agents.

Each agent's first user message names its script (``[script:NAME]``); the
endpoint answers that session's requests in order from the script. Every
request body is kept, so a test can compare what dsh sent the model with
the requests rebuilt from the log.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tests.local_endpoint import LocalEndpoint

__all__ = ["Reply", "SCRIPTS", "ScriptedModel"]


@dataclass(frozen=True)
class Reply:
    """One model answer: text, reasoning, tool calls, or an HTTP error."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments JSON text)
    finish: str = "stop"  # stop | tool_calls | length
    status: int = 200
    hang: bool = False  # stream the text, then hold the response open until the client goes away


SCRIPTS: dict[str, list[Reply]] = {
    "plain": [Reply(text="Hello from the scripted model.", reasoning="The user says hello.")],
    "tools": [Reply(text="Let me look.", tool_calls=(("bash", '{"command": "echo TOOL_OK"}'),), finish="tool_calls"),
              Reply(text="The command printed TOOL_OK.")],
    "parallel": [Reply(tool_calls=(("bash", '{"command": "echo ONE"}'), ("bash", '{"command": "echo TWO"}')),
                       finish="tool_calls"),
                 Reply(text="Both commands ran.")],
    "retry": [Reply(status=500), Reply(text="Answered on the second attempt.")],
    "max-tokens": [Reply(text="This answer is cut off because it ran out of", finish="length")],
    "two-turns": [Reply(text="First answer."), Reply(text="Second answer.")],
    "hang": [Reply(text="Thinking about it", hang=True)],
    # reasoning and tool calls replayed in later requests, within a turn and across turns
    "reasoned-tools": [Reply(reasoning="Run it first.", text="Running.", finish="tool_calls",
                             tool_calls=(("bash", '{"command": "echo REASONED", "description": "Print a word"}'),
                                         ("bash", '{"command": "true", "description": "Print nothing"}'))),
                       Reply(reasoning="It printed the word.", text="It printed REASONED."),
                       Reply(reasoning="A second question.", text="Second answer.")],
    "chain": [Reply(tool_calls=(("bash", '{"command": "echo FIRST", "description": "Print first"}'),),
                    finish="tool_calls"),
              Reply(tool_calls=(("bash", '{"command": "echo SECOND", "description": "Print second"}'),),
                    finish="tool_calls"),
              Reply(text="Both steps ran.")],
}


@dataclass
class _Session:
    script: list[Reply]
    served: int = 0


@dataclass
class ScriptedModel(LocalEndpoint):
    """Runs on its own thread and event loop; ``url`` once started."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    _sessions: dict[str, _Session] = field(default_factory=dict)


    def _script_of(self, body: dict[str, Any]) -> _Session:
        first_user = next((m for m in body.get("messages", []) if m.get("role") == "user"), {})
        content = first_user.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        match = re.search(r"\[script:([a-z0-9-]+)#([0-9a-z-]+)\]", text)
        if not match:
            raise ValueError(f"no [script:NAME#ID] tag in the first user message: {text[:200]}")
        name, instance = match.groups()
        return self._sessions.setdefault(f"{name}#{instance}", _Session(SCRIPTS[name]))

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
                payload = json.dumps({"error": {"message": "scripted failure", "type": "server_error"}}).encode()
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


def _stream(reply: Reply, model: str) -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1767225600, "model": model}

    def delta(body: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": body, "finish_reason": finish}]}

    chunks = [delta({"role": "assistant", "content": ""})]
    for piece in _pieces(reply.reasoning):
        chunks.append(delta({"reasoning_content": piece}))
    for piece in _pieces(reply.text):
        chunks.append(delta({"content": piece}))
    for index, (name, arguments) in enumerate(reply.tool_calls):
        call_id = f"call_{index}_{abs(hash((name, arguments))) % 10**8}"
        chunks.append(delta({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        for piece in _pieces(arguments, 6):
            chunks.append(delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(delta({}, reply.finish))
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20,
                                                    "total_tokens": 120}})
    return chunks


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]
