"""What a loaded log says: turns, requests, token usage (a load observer).

:class:`LogAnalysis` follows a load (see :mod:`dsh_core.storage.reader`) and
collects the per-turn outcomes, every request attempt with its
reconstruction inputs, and token usage by model. With ``keep_requests``
off it only counts requests, so memory stays with the derived history.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .request import Boundary, BoundaryTracker
from .session import SessionState
from .storage.records import ChunkRow

__all__ = ["LogAnalysis", "RequestRecord"]

_USAGE_FIELDS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")


class RequestRecord(dict):
    """``{turn, step, attempt, boundarySeq, header, context, messages}``."""


class LogAnalysis:
    """Load observer collecting turns, requests and usage."""

    watched_types = frozenset({"assistant/chunk", "assistant/message", "turn/start", "step/start", "turn/end"})

    def __init__(self, keep_requests: bool = True) -> None:
        self.keep_requests = keep_requests
        self.boundaries = BoundaryTracker()
        self.turns: list[dict[str, Any]] = []
        self.requests: list[RequestRecord] = []
        self.request_count = 0
        self.steps = 0
        self.usage: dict[tuple[str, str], Counter[str]] = {}
        self.end_reasons: Counter[str] = Counter()

    def _request(self, boundary: Boundary | None, state: SessionState) -> None:
        if boundary is None:
            return
        self.request_count += 1
        if self.keep_requests:
            self.requests.append(RequestRecord(
                turn=boundary.turn, step=boundary.step, attempt=boundary.attempt, boundarySeq=boundary.seq,
                header=state.header, context=state.context, messages=state.messages()))

    def before_event(self, event: dict[str, Any], state: SessionState) -> None:
        data = event["data"]
        if event["type"] in ("assistant/chunk", "assistant/message") and isinstance(data, dict):
            self._request(self.boundaries.observe(event["type"], event["seq"], data), state)

    def after_event(self, event: dict[str, Any], state: SessionState) -> None:
        event_type, data = event["type"], event["data"]
        if event_type == "turn/start":
            self.turns.append({"turn": data.get("turn"), "reason": None, "steps": 0})
        elif event_type == "step/start":
            self.steps += 1
            if self.turns:
                self.turns[-1]["steps"] += 1
        elif event_type == "turn/end":
            reason = data.get("reason")
            for entry in reversed(self.turns):
                if entry["reason"] is None and entry["turn"] == data.get("turn"):
                    entry["reason"] = reason
                    break
            if isinstance(reason, dict) and isinstance(reason.get("kind"), str):
                self.end_reasons[reason["kind"]] += 1
        elif event_type == "assistant/message":
            usage = data.get("usage")
            source = data["message"]["source"]
            if isinstance(usage, dict):
                totals = self.usage.setdefault((str(source.get("provider")), str(source.get("model"))), Counter())
                for name in _USAGE_FIELDS:
                    value = usage.get(name)
                    if type(value) is int:
                        totals[name] += value

    def chunk_run(self, row: ChunkRow, state: SessionState) -> None:
        self._request(self.boundaries.observe_delta_run(row.turn, row.step, row.seq0), state)
