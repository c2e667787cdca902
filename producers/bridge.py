"""The worker bridge: a real dsh agent runtime publishing its sessions live.

It runs dsh's JSON-RPC agent runtime (newline-delimited JSON-RPC 2.0 over
stdio), sends prompts, and publishes every ``session.event`` notification
to Kafka through the :class:`~producers.publisher.Publisher`, in seq order,
preceded by the session's header record (read from the session file dsh
writes), with a flush at every turn end. If the runtime dies mid-turn the
bridge publishes what it received and raises :class:`RuntimeDiedError`;
the session files on disk stay the source the shipper completes from.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter

from dsh_core.errors import DecodeError, PipelineError
from dsh_core.jsonvalue import decode_json
from dsh_kafka.config import Secret
from dsh_core.session_header import SessionHeader, parse_header_line
from dsh_core.storage.framing import frame_plaintext, iter_frames
from dsh_core.storage.lines import MAX_LINE_BYTES
from dsh_core.storage.layout import encode_segment

from .errors import RuntimeDiedError

__all__ = ["AgentBridge", "RuntimeConfig", "WorkerBridge", "TurnResult", "find_runtime"]

#: How much of a runtime's stderr is kept to say why it died.
STDERR_TAIL_BYTES = 4096
#: How long a runtime whose stdout closed is given to exit before saying how it ended.
EXIT_WAIT_SECONDS = 5.0

BRIDGE_EVENTS = Counter("dsh_bridge_events_total", "Session events received from dsh runtimes and published.")
BRIDGE_TURNS = Counter("dsh_bridge_turns_total", "Turns run through the bridge, by outcome.", ["outcome"])


def find_runtime() -> tuple[Path, Path]:
    """The runtime executable and its ``cordis.yml`` from the installed
    ``deepseek-harness-runtime-bin`` wheel."""
    try:
        import deepseek_harness_runtime
    except ImportError:
        raise PipelineError("the dsh runtime is not installed: pip install 'deepseek-harness-runtime-bin==0.1.1rc1'") from None
    runtime = Path(deepseek_harness_runtime.__file__).parent / "runtime"
    executable = runtime / "dsh-jsonrpc-agent-pkg-linux-x64"
    if not executable.exists():
        raise PipelineError(f"no dsh runtime executable for this platform under {runtime}")
    return executable, runtime / "cordis.yml"


@dataclass(frozen=True)
class RuntimeConfig:
    """Where one dsh runtime process lives and which model endpoint it calls."""

    executable: Path
    cordis_config: Path
    workspace: Path
    session_root: Path
    home: Path
    model_url: str
    api_key: Secret
    provider: str = "deepseek-official"
    model: str = "deepseek-v4-flash"
    permission_mode: str = "danger-full-access"

    def environment(self) -> dict[str, str]:
        return {**os.environ, "DSH_HOME": str(self.home), "DSH_SESSION_ROOT": str(self.session_root),
                "DSH_CWD": str(self.workspace), "DSH_CORDIS_CONFIG": str(self.cordis_config),
                "DEEPSEEK_BASE_URL": self.model_url, "DEEPSEEK_API_KEY": self.api_key.reveal(),
                "DSH_TELEMETRY_DISABLED": "1", "DSH_PERMISSION_MODE": self.permission_mode}


@dataclass
class TurnResult:
    session_id: str
    events: int
    last_seq: int
    end_reason: Any


class AgentBridge(Protocol):
    """What a bridge of either runtime line is (this JSON-RPC one, and
    :class:`producers.headless.HeadlessBridge` for dsh 0.2.x): used in
    ``async with``, it runs a turn per ``prompt`` and publishes it live.
    ``session_id`` ``None`` starts a session where the runtime makes ids."""

    async def __aenter__(self) -> "AgentBridge": ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def prompt(self, session_id: str | None, text: str) -> "TurnResult": ...


@dataclass
class _Session:
    session_id: str
    next_seq: int = 0
    header_sent: bool = False
    buffered: list[dict[str, Any]] = field(default_factory=list)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class WorkerBridge:
    """One runtime process; ``prompt()`` runs a turn and publishes it live.

    ``publisher`` needs ``publish_header``, ``publish_event`` and ``flush``.
    """

    def __init__(self, config: RuntimeConfig, publisher: Any, header_timeout: float = 10.0) -> None:
        self.config = config
        self.publisher = publisher
        self.header_timeout = header_timeout
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._next_id = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._sessions: dict[str, _Session] = {}
        self._died: str | None = None
        self._stderr_tail = bytearray()  # the last STDERR_TAIL_BYTES the runtime wrote, for why it died
        self._stderr: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        """The runtime's process id while it runs."""
        return self._process.pid if self._process is not None else None

    async def __aenter__(self) -> "WorkerBridge":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        for folder in (self.config.workspace, self.config.session_root, self.config.home):
            folder.mkdir(parents=True, exist_ok=True)
        self._process = await asyncio.create_subprocess_exec(
            str(self.config.executable), cwd=self.config.workspace, env=self.config.environment(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024)
        self._stderr = asyncio.create_task(self._keep_stderr_tail())
        self._reader = asyncio.create_task(self._read_loop())
        await self._call("initialize", {"cwd": str(self.config.workspace), "provider": self.config.provider,
                                        "model": self.config.model})

    async def close(self) -> None:
        """Shut the runtime down (idempotent); kills it after a deadline."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None and self._died is None:
            try:
                await asyncio.wait_for(self._call("shutdown", {}), 10)
            except (PipelineError, asyncio.TimeoutError):
                pass
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
        for task in (self._reader, self._stderr):
            if task is not None:
                task.cancel()

    # --------------------------------------------------------------- protocol

    async def _call(self, method: str, params: dict[str, Any]) -> Any:
        if self._died is not None or self._process is None or self._process.stdin is None:
            raise RuntimeDiedError(f"dsh runtime is gone ({self._died or 'not started'}); cannot call {method}")
        self._next_id += 1
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        frame = json.dumps({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        self._process.stdin.write(frame.encode() + b"\n")
        await self._process.stdin.drain()
        return await future

    async def _read_loop(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        reason = "stdout closed"
        try:
            async for line in self._process.stdout:
                try:
                    message = decode_json(line)
                except DecodeError:
                    reason = f"non-JSON frame on stdout: {line[:200]!r}"
                    break
                self._dispatch(message)
        finally:
            self._died = f"{reason}; {await self._exit_status()}"
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(RuntimeDiedError(f"dsh runtime died: {self._died}"))
            for session in self._sessions.values():
                session.queue.put_nowait(None)

    async def _keep_stderr_tail(self) -> None:
        """Drain the runtime's stderr (so it never blocks on a full pipe),
        keeping only its last bytes: memory stays bounded however much it says."""
        assert self._process is not None and self._process.stderr is not None
        while chunk := await self._process.stderr.read(STDERR_TAIL_BYTES):
            self._stderr_tail += chunk
            del self._stderr_tail[:-STDERR_TAIL_BYTES]

    async def _exit_status(self) -> str:
        """How the runtime ended, once its stdout closed: its exit code (or
        signal) and the last line of its stderr, waited for briefly."""
        process = self._process
        if process is None:
            return "closed by the bridge"
        exited = asyncio.ensure_future(process.wait())
        await asyncio.wait({exited}, timeout=EXIT_WAIT_SECONDS)
        exited.cancel()
        if self._stderr is not None:  # its end follows the exit
            await asyncio.wait({self._stderr}, timeout=EXIT_WAIT_SECONDS)
        code = process.returncode
        status = ("still running" if code is None else
                  f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        said = self._stderr_tail.decode("utf-8", "replace").strip().splitlines()
        return f"{status}; stderr: {said[-1][:500]!r}" if said else f"{status}; nothing on stderr"

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message and ("result" in message or "error" in message):
            future = self._pending.pop(message["id"], None)
            if future is not None and not future.done():
                if "error" in message:
                    future.set_exception(PipelineError(f"dsh runtime refused the call: {message['error']}"))
                else:
                    future.set_result(message["result"])
            return
        params = message.get("params") or {}
        session_id = params.get("sessionId")
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            return
        if message.get("method") == "session.event":
            session.queue.put_nowait(("event", params["event"]))
        elif message.get("method") == "session.status":
            session.queue.put_nowait(("status", params.get("status")))

    # ------------------------------------------------------------------ turns

    async def prompt(self, session_id: str | None, text: str) -> TurnResult:
        """Run one turn; every event is published as it arrives (after the
        header), and the publisher is flushed at the turn's end. The JSON-RPC
        runtime makes no session: ``session_id`` names the one to use."""
        if session_id is None:
            raise PipelineError("the dsh JSON-RPC runtime needs a session id (the headless runtime makes one)")
        session = self._sessions.setdefault(session_id, _Session(session_id))
        call = asyncio.ensure_future(self._call("session/prompt", {
            "sessionId": session_id, "contentBlocks": [{"type": "text", "text": text}]}))
        events = 0
        end_reason: Any = None
        turn_ended = idle = False
        try:
            while not (turn_ended and idle):
                item = await session.queue.get()
                if item is None:
                    raise RuntimeDiedError(f"dsh runtime died mid-turn in session {session_id!r} after seq "
                                           f"{session.next_seq - 1}: {self._died}")
                kind, payload = item
                if kind == "status":
                    idle = payload == "idle" and turn_ended
                    continue
                await self._publish(session, payload)
                events += 1
                if payload.get("type") == "turn/end":
                    turn_ended = True
                    end_reason = (payload.get("data") or {}).get("reason")
            await call
            await self._ensure_header(session, wait=True)
            await self.publisher.flush()
            BRIDGE_TURNS.labels("completed").inc()
        except BaseException:
            BRIDGE_TURNS.labels("failed").inc()
            await self._ensure_header(session, wait=False)
            await self.publisher.flush()
            raise
        return TurnResult(session_id, events, session.next_seq - 1, end_reason)

    async def _publish(self, session: _Session, event: dict[str, Any]) -> None:
        seq = event.get("seq")
        if seq != session.next_seq:
            raise RuntimeDiedError(f"session {session.session_id!r}: the runtime streamed seq {seq}, "
                                   f"expected {session.next_seq}")
        session.next_seq += 1
        BRIDGE_EVENTS.inc()
        if not session.header_sent:
            session.buffered.append(event)
            await self._ensure_header(session, wait=False)
            return
        await self.publisher.publish_event(session.session_id, event)

    async def _ensure_header(self, session: _Session, wait: bool) -> None:
        """Publish the header (from dsh's own file) and what was buffered."""
        if session.header_sent:
            return
        header = self._read_header(session.session_id)
        deadline = asyncio.get_running_loop().time() + (self.header_timeout if wait else 0)
        while header is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)  # dsh writes its file within its 200 ms batch window
            header = self._read_header(session.session_id)
        if header is None:
            if wait:
                raise PipelineError(f"session {session.session_id!r}: dsh wrote no session file under "
                                    f"{self.config.session_root} within {self.header_timeout} s")
            return
        await self.publisher.publish_header(header)
        session.header_sent = True
        for event in session.buffered:
            await self.publisher.publish_event(session.session_id, event)
        session.buffered = []

    def _read_header(self, session_id: str) -> SessionHeader | None:
        segment = encode_segment(session_id)
        for path in sorted(self.config.session_root.glob(f"*/{segment}/session*.jsonl*")):
            try:
                if path.name.endswith(".zstd"):
                    with open(path, "rb") as stream:
                        frame = next(iter_frames(stream, str(path)), None)
                        if frame is None or not frame.complete:
                            return None
                        line = frame_plaintext(stream, frame, str(path), MAX_LINE_BYTES + 1).rstrip(b"\n")
                else:
                    with open(path, "rb") as stream:
                        line = stream.readline()
                    if not line.endswith(b"\n"):
                        return None
                    line = line[:-1]
                return parse_header_line(decode_json(line), str(path))
            except (OSError, DecodeError):
                return None
        return None
