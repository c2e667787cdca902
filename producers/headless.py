"""The worker bridge for dsh 0.2.x: headless agents, their sessions published live.

dsh 0.2.x runs a turn as a process, ``dsh --profile headless --json TASK``
(``--session-id ID`` continues a stored session). Its ``--json`` output is
a progress stream (first the session's id and cwd, then status phases,
text and tool calls), not the log, so the bridge follows the log dsh
writes, ``$DSH_HOME/sessions/<project>/<id>/session.v4.jsonl.zstd``: each
zstd frame (one append batch; dsh writes one every 200 ms while events
come) is published as soon as it is complete, its lines byte for byte,
read by the shipper's reader (:mod:`producers.session_tail`). When the
process exits (the headless runner flushes its log first) the file is read
to its end and the publisher flushed, so the turn's last events — the final
``assistant/message``, ``step/end`` and ``turn/end``, which dsh's own
in-request log shipping never delivers — are in Kafka when
:meth:`HeadlessBridge.prompt` returns.

A runtime that exits without ending its turn (a crash, a refused
``--session-id``) raises :class:`RuntimeDiedError` naming the session, the
last seq published and the runtime's own last words; what it wrote before is
published, and the file stays where the shipper completes it from.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh_core.storage.layout import log_path
from dsh_kafka.config import Secret

from .bridge import BRIDGE_EVENTS, BRIDGE_TURNS, TurnResult
from .errors import RuntimeDiedError
from .session_tail import Position, SessionTail

__all__ = ["HeadlessConfig", "HeadlessBridge"]

#: The format the 0.2.x runtime writes.
FORMAT = 4


@dataclass(frozen=True)
class HeadlessConfig:
    """Where the headless runtime runs and which model endpoint it calls."""

    executable: Path
    workspace: Path
    home: Path  # DSH_HOME: sessions go under home/sessions
    model_url: str
    api_key: Secret
    permission_mode: str = "danger-full-access"
    poll_seconds: float = 0.05  # how often the log is read while the runtime runs
    turn_timeout: float = 600.0

    def environment(self) -> dict[str, str]:
        return {**os.environ, "DSH_HOME": str(self.home), "DEEPSEEK_BASE_URL": self.model_url,
                "DEEPSEEK_API_KEY": self.api_key.reveal(), "DSH_TELEMETRY_DISABLED": "1",
                "DSH_PERMISSION_MODE": self.permission_mode}


@dataclass
class _Turn:
    """What one runtime process has said and written so far."""

    session_id: str | None = None
    path: Path | None = None
    end_reason: Any = None
    ended: bool = False
    events: int = 0
    progress: list[str] = field(default_factory=list)  # progress lines that are not JSON (kept for errors)


class HeadlessBridge:
    """Runs headless dsh turns and publishes their sessions live.

    ``publisher`` needs ``send(record)`` and ``flush()`` (a
    :class:`~producers.publisher.Publisher`)."""

    def __init__(self, config: HeadlessConfig, publisher: Any) -> None:
        self.config = config
        self.publisher = publisher
        self._positions: dict[str, Position] = {}  # what was published of each session's log
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> "HeadlessBridge":
        for folder in (self.config.workspace, self.config.home):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop()

    @property
    def pid(self) -> int | None:
        """The running turn's process id, if one runs."""
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    async def prompt(self, session_id: str | None, text: str) -> TurnResult:
        """Run one turn (a new session when ``session_id`` is ``None``);
        returns when its process has exited and its log is published."""
        argv = [str(self.config.executable), "--profile", "headless", "--json"]
        argv += ["--session-id", session_id] if session_id else []
        self._process = process = await asyncio.create_subprocess_exec(
            *argv, text, cwd=self.config.workspace, env=self.config.environment(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=64 * 1024 * 1024)
        turn = _Turn()
        progress = asyncio.create_task(self._follow_progress(process, turn))
        assert process.stdout is not None and process.stderr is not None  # both PIPE
        errors = asyncio.create_task(process.stderr.read())
        exited = asyncio.ensure_future(process.wait())
        try:
            deadline = asyncio.get_running_loop().time() + self.config.turn_timeout
            while not exited.done():
                await asyncio.wait({exited}, timeout=self.config.poll_seconds)
                if not exited.done() and asyncio.get_running_loop().time() > deadline:
                    raise RuntimeDiedError(f"dsh headless turn{_of(turn)} ran over {self.config.turn_timeout} s; "
                                           "stopped")
                await self._publish_new(turn)
            await progress
            await self._publish_new(turn)  # the runner flushed its log before exiting
            stderr = (await errors).decode("utf-8", "replace").strip()
        except BaseException:
            BRIDGE_TURNS.labels("failed").inc()
            await self._stop()
            await self.publisher.flush()
            raise
        finally:
            for task in (progress, errors, exited):
                task.cancel()
        await self.publisher.flush()
        if not turn.ended:
            BRIDGE_TURNS.labels("failed").inc()
            said = (stderr or "\n".join(turn.progress) or "nothing").splitlines()[-1]
            position = self._positions.get(turn.session_id or "")
            where = f" after seq {position.next_seq - 1}" if position is not None else ""
            raise RuntimeDiedError(f"dsh headless runtime exited {process.returncode} without ending its turn"
                                   f"{_of(turn)}{where}: {said}")
        if turn.session_id is None:
            BRIDGE_TURNS.labels("failed").inc()
            raise RuntimeDiedError(f"dsh headless runtime ended its turn{_of(turn)} without naming its session")
        BRIDGE_TURNS.labels("completed").inc()
        position = self._positions[turn.session_id]
        return TurnResult(turn.session_id, turn.events, position.next_seq - 1, turn.end_reason)

    async def _follow_progress(self, process: asyncio.subprocess.Process, turn: _Turn) -> None:
        """Read the ``--json`` stream: the session it names, and its turn's end."""
        assert process.stdout is not None  # PIPE
        while line := await process.stdout.readline():
            try:
                item = json.loads(line)
            except ValueError:
                turn.progress.append(line.decode("utf-8", "replace").rstrip())
                continue
            if not isinstance(item, dict):
                continue
            if item.get("type") == "session" and turn.session_id is None:
                turn.session_id = str(item.get("sessionId"))
                turn.path = log_path(self.config.home / "sessions", item.get("cwd"), turn.session_id, "zstd", FORMAT)
            elif item.get("type") == "status" and item.get("phase") == "turn_end":
                turn.ended, turn.end_reason = True, item.get("reason")

    async def _publish_new(self, turn: _Turn) -> None:
        """Publish the complete frames dsh appended since the last read."""
        session_id = turn.session_id
        if turn.path is None or session_id is None or not turn.path.exists():
            return
        tail = SessionTail(turn.path, self._positions.get(session_id, Position()))
        try:
            for record in tail:
                await self.publisher.send(record)
                turn.events += record.count
                BRIDGE_EVENTS.inc(record.count)
        finally:
            self._positions[session_id] = tail.position

    async def _stop(self) -> None:
        process = self._process
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()


def _of(turn: _Turn) -> str:
    return f" of session {turn.session_id!r}" if turn.session_id else ""
