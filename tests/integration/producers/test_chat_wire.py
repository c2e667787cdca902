"""Every chat-completions request a real dsh 0.1.1rc1 agent sends is rebuilt,
body for body, from its v0 session log by :func:`chat_completions_body`.

Real JSON-RPC runtimes run against the scripted model (no broker: the
bridge publishes to a stub). The model keeps every body it receives with
the request's headers; dsh names the session in
``x-deepseek-harness-session-id``, so the bodies are grouped by it.
"""

from __future__ import annotations

import asyncio
import contextvars
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dsh_core.chat_wire import chat_completions_body
from dsh_core.errors import PipelineError
from dsh_core.inspect import inspect_path
from dsh_core.storage.layout import find_session_files
from dsh_kafka.config import Secret
from producers.bridge import RuntimeConfig, WorkerBridge, find_runtime
from tests.conftest import canonical
from tests.scripted_model import ScriptedModel

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                                reason="the dsh runtime wheel is linux x86_64 only")

#: script name → prompts sent to its session
SCENARIOS = {"plain": 1, "tools": 1, "parallel": 1, "retry": 1, "max-tokens": 1, "two-turns": 2, "reasoned-tools": 2}
SESSION_HEADER = "x-deepseek-harness-session-id"
_HEADERS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("headers")


class _HeaderTap:
    """A request reader that keeps the header lines it hands on."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader, self.headers, self.done = reader, {}, False

    async def readline(self) -> bytes:
        line = await self.reader.readline()
        if not self.done:
            key, colon, value = line.decode().partition(":")
            self.done = line in (b"\r\n", b"\n", b"")
            if colon:
                self.headers[key.strip().lower()] = value.strip()
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


@dataclass
class _HeaderModel(ScriptedModel):
    """The scripted model, also keeping each body's request headers."""

    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tap = _HeaderTap(reader)
        _HEADERS.set(tap.headers)  # each connection is served by its own task
        await super()._handle(tap, writer)  # type: ignore[arg-type]

    def _script_of(self, body: dict[str, Any]) -> Any:
        self.received.append((_HEADERS.get(), body))
        return super()._script_of(body)


class _NoPublisher:
    async def publish_header(self, header: Any) -> None:
        pass

    async def publish_event(self, session_id: str, event: dict) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def send(self, record: Any) -> None:
        pass


def test_every_request_body_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    try:
        executable, cordis = find_runtime()
    except PipelineError as error:
        pytest.skip(str(error))
    root = tmp_path / "sessions"

    async def agent(model_url: str, name: str, turns: int) -> None:
        config = RuntimeConfig(executable=executable, cordis_config=cordis, workspace=tmp_path / f"ws-{name}",
                               session_root=root, home=tmp_path / f"home-{name}", model_url=model_url,
                               api_key=Secret("test-key"))
        async with WorkerBridge(config, _NoPublisher()) as bridge:
            for turn in range(turns):
                await bridge.prompt(f"wire-{name}", f"[script:{name}#{name}] turn {turn + 1}: go")

    async def fleet(model_url: str) -> None:
        await asyncio.gather(*(agent(model_url, name, turns) for name, turns in SCENARIOS.items()))

    with _HeaderModel() as model:
        asyncio.run(asyncio.wait_for(fleet(model.url), 120))
    sent: dict[str, list[dict[str, Any]]] = {}
    for headers, body in model.received:
        sent.setdefault(headers[SESSION_HEADER], []).append(body)
        assert "x-deepseek-harness-compact" not in headers

    files = {path.parent.name: path for path in find_session_files(root)}
    assert set(files) == set(sent) == {f"wire-{name}" for name in SCENARIOS}
    for session_id, path in files.items():
        report = inspect_path(path).to_json()
        assert report["accepted"], report["error"]
        rebuilt = [chat_completions_body(r["header"], r["messages"]) for r in report["requests"]]
        assert canonical(rebuilt) == canonical(sent[session_id]), session_id
    # every request was an agent step: retries included, no title or other auxiliary call
    assert {s: len(bodies) for s, bodies in sent.items()} == {
        "wire-plain": 1, "wire-tools": 2, "wire-parallel": 2, "wire-retry": 2, "wire-max-tokens": 1,
        "wire-two-turns": 2, "wire-reasoned-tools": 3}
    replayed = sent["wire-reasoned-tools"][2]["messages"]
    assert [m.get("reasoning_content") for m in replayed if m["role"] == "assistant"] == [
        "Run it first.", "It printed the word."]
