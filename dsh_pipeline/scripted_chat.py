"""A scripted OpenAI-style chat-completions model for real dsh agents.

Each agent's first user message names its script with a tag,
``[script:NAME#ID]``: the model answers that session's requests in order
from :data:`SCRIPTS` ``[NAME]`` (the last reply again once the script is
used up), streamed as chat-completions chunks. The demo runs real dsh
0.1.1rc1 agents against it (:mod:`dsh_pipeline.demo_agents`); the tests'
``tests/scripted_model.py`` streams the same replies.

:class:`ScriptedChat` is the ASGI app; :class:`ScriptedChatServer` serves it
with uvicorn (through :class:`producers.asgi_server.AsgiServer`) on a
loopback port, on a thread and event loop of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

from producers.asgi_server import AsgiServer

__all__ = ["Reply", "SCRIPTS", "ScriptedChat", "ScriptedChatServer", "script_tag"]


@dataclass(frozen=True)
class Reply:
    """One model answer: text, reasoning, tool calls, or an HTTP error."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, arguments JSON text)
    finish: str = "stop"  # stop | tool_calls | length
    status: int = 200
    hang: bool = False  # stream the text, then hold the response open until the client goes away
    error: str = "scripted failure"  # the message of a non-200 answer's error body


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

_TAG = re.compile(r"\[script:([a-z0-9-]+)#([0-9a-z-]+)\]")


def script_tag(body: dict[str, Any]) -> tuple[str, str]:
    """``(NAME, ID)`` of the ``[script:NAME#ID]`` tag in the first of a
    request's user messages that holds one (after a compaction the first is
    the checkpoint summary, which may not); :class:`ValueError` without one."""
    texts = []
    for message in body.get("messages", []):
        if message.get("role") == "user":
            content = message.get("content")
            texts.append(content if isinstance(content, str) else json.dumps(content))
            match = _TAG.search(texts[-1])
            if match:
                name, instance = match.groups()
                return name, instance
    raise ValueError(f"no [script:NAME#ID] tag in any user message: {(texts or [''])[0][:200]}")


def _stream(reply: Reply, model: str) -> list[dict[str, Any]]:
    """The chat-completions chunks streaming ``reply`` (usage last)."""
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


class ScriptedChat:
    """The ASGI app: ``POST …/chat/completions`` answered from the script
    its tag names (a request without a known tag: HTTP 400; another path:
    404). ``requests`` counts the chat-completions requests received."""

    def __init__(self, scripts: dict[str, list[Reply]] | None = None) -> None:
        self.scripts = SCRIPTS if scripts is None else scripts
        self.served: dict[str, int] = {}  # NAME#ID -> replies given
        self.requests = 0

    async def aclose(self) -> None:
        """Nothing to release (the server calls it on exit)."""

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # served with lifespan="off": nothing else arrives
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST" or not scope["path"].rstrip("/").endswith("/chat/completions"):
            await _json(send, 404, {"error": {"message": f"no {scope['method']} {scope['path']} here",
                                              "type": "not_found"}})
            return
        self.requests += 1
        try:
            parsed = json.loads(body)
            name, instance = script_tag(parsed)
            script = self.scripts[name]
        except (ValueError, KeyError, AttributeError) as error:
            await _json(send, 400, {"error": {"message": f"scripted model: {error}", "type": "invalid_request"}})
            return
        key = f"{name}#{instance}"
        reply = script[min(self.served.get(key, 0), len(script) - 1)]
        self.served[key] = self.served.get(key, 0) + 1
        if reply.status != 200:
            await _json(send, reply.status, {"error": {"message": reply.error, "type": "server_error"}})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        chunks = _stream(reply, parsed.get("model", "model"))
        if reply.hang:  # the text so far, then nothing until the caller disconnects
            chunks = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
        for chunk in chunks:
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                        "more_body": True})
        if reply.hang:
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _json(send: Callable, status: int, value: Any) -> None:
    payload = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


class ScriptedChatServer:
    """Serves a :class:`ScriptedChat` (``app``) on ``127.0.0.1`` while in
    ``with``, on a thread and event loop of its own; ``url`` once entered
    (the socket is listening by then)."""

    def __init__(self, app: ScriptedChat | None = None, timeout: float = 10.0) -> None:
        self.app = app or ScriptedChat()
        self.timeout = timeout
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> "ScriptedChatServer":
        ready = threading.Event()

        async def serve() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            try:
                async with AsgiServer(self.app, "the scripted model") as server:
                    self.url = server.url
                    ready.set()
                    await self._stop.wait()
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                self._error = error
            finally:
                ready.set()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name="scripted-chat", daemon=True)
        self._thread.start()
        if not ready.wait(self.timeout):
            raise RuntimeError(f"the scripted model did not start within {self.timeout:g} s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(self.timeout)
