"""A scripted, local Anthropic-Messages-style endpoint for real dsh 0.2.x agents.

dsh 0.2.x calls ``POST $DEEPSEEK_BASE_URL/v1/messages`` with ``stream: true``
and names its session in the ``x-deepseek-harness-session-id`` header. A
session's script is chosen once, from a ``[script:NAME]`` marker in the user's
text, and that session's agent requests are answered in order from it, also
across processes that continue the session with ``--session-id``. Two kinds of
auxiliary request never consume the script:

* a title request (system prompt starting "Create a concise title") gets a
  short title;
* a compaction request (``x-deepseek-harness-compact: 1``, or a last user
  message starting "You are now acting as a compaction engine") gets a short
  checkpoint summary.

Every request body is kept with its session id, kind and the HTTP status
answered, so a test can compare what dsh sent the model with the requests
rebuilt from the log.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.local_endpoint import LocalEndpoint

__all__ = ["Captured", "Reply", "SCRIPTS", "ScriptedMessages", "TITLE"]

Kind = Literal["agent", "title", "compaction"]
SESSION_HEADER = "x-deepseek-harness-session-id"
COMPACT_HEADER = "x-deepseek-harness-compact"
TITLE_PROMPT = "Create a concise title"
COMPACTION_PROMPT = "You are now acting as a compaction engine"
TITLE = "Scripted session"
SUMMARY = "## Primary Request and Intent\n- Scripted check.\n## Current Work\n- (none)"
#: What dsh 0.2.1 classifies as CONTEXT_WINDOW_EXCEEDED: an error detail (type,
#: code, message) matching ``\b(?:maximum|max) context (?:length|window)\b``
#: (``isContextWindowExceededError`` in ``@deepseek-ai/dsh-llm``).
OVERFLOW_MESSAGE = "This model's maximum context length is 1000000 tokens. However, you requested 1200000 tokens."


@dataclass(frozen=True)
class Reply:
    """One model answer: thinking, text and tool calls, or a failure.

    ``error``: ``"server"`` answers HTTP 500 (dsh retries within the step);
    ``"overflow"`` answers HTTP 400 with a context-window error (dsh compacts,
    then retries); ``"overloaded"`` streams the blocks, then an in-band
    ``error`` event (``overloaded_error``) instead of ``message_delta``.
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()  # (name, input JSON text)
    stop: str = "end_turn"  # end_turn | tool_use | max_tokens
    error: Literal["", "server", "overflow", "overloaded"] = ""

    @property
    def status(self) -> int:
        return {"server": 500, "overflow": 400}.get(self.error, 200)


@dataclass(frozen=True)
class Captured:
    """One request as it arrived: no headers are kept (they hold the API key)."""

    session_id: str
    kind: Kind
    status: int
    body: dict[str, Any]


def _bash(command: str, description: str) -> tuple[str, str]:
    return ("bash", json.dumps({"command": command, "description": description}))


SCRIPTS: dict[str, list[Reply]] = {
    "plain": [Reply(text="Hello from the scripted model.", reasoning="The user says hello.")],
    "tools": [Reply(text="Let me look.", tool_calls=(_bash("echo TOOL_OK", "Print a marker"),), stop="tool_use"),
              Reply(text="The command printed TOOL_OK.")],
    "parallel": [Reply(tool_calls=(_bash("echo ONE", "Print one"), _bash("echo TWO", "Print two")), stop="tool_use"),
                 Reply(text="Both commands ran.")],
    "retry": [Reply(error="server"), Reply(text="Answered on the second attempt.")],
    "stream-error": [Reply(text="Partial answ", reasoning="Start.", error="overloaded"),
                     Reply(text="Answered after a stream error.")],
    "max-tokens": [Reply(text="This answer is cut off because it ran out of", stop="max_tokens")],
    "two-turns": [Reply(text="First answer."), Reply(text="Second answer.")],
    "tool-error": [Reply(tool_calls=(("no_such_tool", '{"x": 1}'), ("bash", '{"description": "No command"}')),
                         stop="tool_use"),
                   Reply(text="Both tool calls failed.")],
    "compact": [Reply(text="First answer, long enough to be worth compacting later: " + "lorem ipsum " * 40),
                Reply(error="overflow"), Reply(text="Answered after compaction.")],
}


@dataclass
class _Session:
    name: str
    script: list[Reply]
    served: int = 0


@dataclass
class ScriptedMessages(LocalEndpoint):
    """Runs on its own thread and event loop; ``url`` once started.

    ``requests`` holds every ``/v1/messages`` request in arrival order;
    ``stray`` the request lines of anything else (answered 404)."""

    scripts: dict[str, list[Reply]] = field(default_factory=lambda: dict(SCRIPTS))
    requests: list[Captured] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)
    _sessions: dict[str, _Session] = field(default_factory=dict)


    def requests_of(self, session_id: str) -> list[Captured]:
        return [request for request in self.requests if request.session_id == session_id]

    def _reply(self, session_id: str, kind: Kind, body: dict[str, Any]) -> Reply:
        if kind == "title":
            return Reply(text=TITLE)
        if kind == "compaction":
            return Reply(text=SUMMARY)
        session = self._sessions.get(session_id)
        if session is None:
            user_text = "\n".join(_text(m.get("content")) for m in body.get("messages", []) if m.get("role") == "user")
            match = re.search(r"\[script:([a-z0-9-]+)\]", user_text)
            if not match or match.group(1) not in self.scripts:
                raise LookupError(f"no known [script:NAME] marker in the user text: {user_text[:200]!r}")
            session = self._sessions[session_id] = _Session(match.group(1), self.scripts[match.group(1)])
        if session.served >= len(session.script):
            raise LookupError(f"script {session.name!r} of session {session_id} has only {len(session.script)} replies")
        session.served += 1
        return session.script[session.served - 1]

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
            if not request_line:  # a connection opened and closed unused
                return
            if not request_line.startswith(b"POST /v1/messages "):
                self.stray.append(request_line.decode(errors="replace").strip())
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            body = json.loads(await _read_body(reader, headers))
            session_id = headers.get(SESSION_HEADER, "")
            kind = _kind(body, headers)
            try:
                reply = self._reply(session_id, kind, body)
            except LookupError as exc:
                self.requests.append(Captured(session_id, kind, 400, body))
                _write_error(writer, 400, "invalid_request_error", str(exc))
                return
            self.requests.append(Captured(session_id, kind, reply.status, body))
            if reply.error == "server":
                _write_error(writer, 500, "api_error", "scripted server failure")
                return
            if reply.error == "overflow":
                _write_error(writer, 400, "invalid_request_error", OVERFLOW_MESSAGE)
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                         b"connection: close\r\n\r\n")
            step = sum(1 for r in self.requests if r.session_id == session_id and r.kind == kind)
            for event in _events(reply, body.get("model", "model"), f"{kind}_{step}"):
                writer.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        finally:
            await writer.drain()
            writer.close()


def _kind(body: dict[str, Any], headers: dict[str, str]) -> Kind:
    if _text(body.get("system")).startswith(TITLE_PROMPT):
        return "title"
    last_user = next((m for m in reversed(body.get("messages", [])) if m.get("role") == "user"), {})
    texts = _texts(last_user.get("content"))
    if headers.get(COMPACT_HEADER) == "1" or any(text.startswith(COMPACTION_PROMPT) for text in texts):
        return "compaction"
    return "agent"


def _texts(content: Any) -> list[str]:
    """The texts of a Messages ``system`` or ``content``: a string or blocks."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [block["text"] for block in content if isinstance(block, dict) and isinstance(block.get("text"), str)]
    return []


def _text(content: Any) -> str:
    return "\n".join(_texts(content))


def _write_error(writer: asyncio.StreamWriter, status: int, error_type: str, message: str) -> None:
    payload = json.dumps({"type": "error", "error": {"type": error_type, "message": message}}).encode()
    reason = {400: "Bad Request", 500: "Internal Server Error"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode() + payload)


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


def _events(reply: Reply, model: str, message_id: str) -> list[dict[str, Any]]:
    """The SSE events of one answer, in order (``error`` replaces the end)."""
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": f"msg_{message_id}", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 0, "cache_read_input_tokens": 0}}}]

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        index = sum(1 for e in events if e["type"] == "content_block_start")
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        events.append({"type": "content_block_stop", "index": index})

    if reply.reasoning:
        block({"type": "thinking", "thinking": "", "signature": ""},
              [{"type": "thinking_delta", "thinking": p} for p in _pieces(reply.reasoning)]
              + [{"type": "signature_delta", "signature": "sig-scripted"}])
    if reply.text:
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in _pieces(reply.text, 16)])
    for index, (name, arguments) in enumerate(reply.tool_calls):
        block({"type": "tool_use", "id": f"toolu_{message_id}_{index}", "name": name, "input": {}},
              [{"type": "input_json_delta", "partial_json": p} for p in _pieces(arguments, 12)])
    if reply.error == "overloaded":  # the last block stays open: the stream breaks off inside it
        events.pop()
        events.append({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        return events
    events.append({"type": "message_delta", "delta": {"stop_reason": reply.stop, "stop_sequence": None},
                   "usage": {"output_tokens": 20}})
    events.append({"type": "message_stop"})
    return events


def _pieces(text: str, size: int = 8) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]
