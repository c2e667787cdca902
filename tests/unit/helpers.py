"""Small builders for session-log tests."""

from __future__ import annotations

from typing import Any

from dsh_core.session import SessionLog


def user(mid: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}, **extra}


def assistant(mid: str, turn: int = 1, step: int = 1, content: list | None = None) -> dict[str, Any]:
    return {"turn": turn, "step": step, "message": {
        "id": mid, "role": "assistant", "content": [{"type": "text", "text": "ok"}] if content is None else content,
        "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}}}


def tool_result(mid: str, call_id: str, text: str = "out", turn: int = 1, step: int = 1, **extra: Any) -> dict[str, Any]:
    return {"turn": turn, "step": step, "message": {
        "id": mid, "role": "user", "source": {"kind": "tool", "callId": call_id},
        "content": [{"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}],
                     "isError": False}]}, **extra}


def header_data(**config: Any) -> dict[str, Any]:
    return {"header": {"config": {"provider": "deepseek", "model": "deepseek-chat", **config}}, "reason": "initial"}


class Clock:
    def __init__(self, start: int = 1_767_225_600_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


def new_log(session_id: str = "s-1") -> SessionLog:
    return SessionLog(session_id, clock=Clock())
