"""What a loaded log says: turns, requests, token usage (a fold observer).

:class:`LogAnalysis` follows a load (see :mod:`dsh_core.fold`) and
collects the per-turn outcomes, every request attempt with its
reconstruction inputs, and token usage by model. With ``keep_requests``
off it only counts requests, so memory stays with the derived history.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import msgspec

from .request import Boundary, BoundaryTracker
from .session import SessionState
from .storage.records import ChunkRow

__all__ = ["AnalysisSnapshot", "LogAnalysis", "RequestRecord"]

_USAGE_FIELDS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")

_REQUEST_TYPES = frozenset({"assistant/chunk", "assistant/attempt", "assistant/message"})


class RequestRecord(dict):
    """``{turn, step, attempt, boundarySeq, header, context, messages}``."""


class AnalysisSnapshot(msgspec.Struct, frozen=True):
    """What :meth:`LogAnalysis.snapshot` saves (kept requests are not saved)."""

    turns: list[dict[str, Any]]
    steps: int
    request_count: int
    usage: list[tuple[str, str, dict[str, int]]]  # (provider, model, token totals)
    end_reasons: dict[str, int]
    boundaries: list[Any]  # BoundaryTracker.to_json()


class LogAnalysis:
    """Fold observer collecting turns, requests and usage."""

    _OUTCOME_TYPES = frozenset({"assistant/message", "turn/start", "step/start", "turn/end"})

    def __init__(self, keep_requests: bool = True, on_turn_end: Callable[[Any], None] | None = None,
                 on_usage: Callable[[str, str, dict[str, int]], None] | None = None,
                 count_requests: bool = True) -> None:
        self.keep_requests = keep_requests
        # Without request counting chunks need not be seen at all (the fold
        # then takes its fast path for them).
        self.count_requests = count_requests
        self.watched_types = self._OUTCOME_TYPES | ({"assistant/chunk", "assistant/attempt"} if count_requests else set())
        self.on_turn_end = on_turn_end  # called with each turn/end reason
        self.on_usage = on_usage  # called with (provider, model, token counts) of each assistant message
        self.boundaries = BoundaryTracker()
        self.turns: list[dict[str, Any]] = []
        self.requests: list[RequestRecord] = []
        self.request_count = 0
        self.steps = 0
        self.usage: dict[tuple[str, str], Counter[str]] = {}
        self.end_reasons: Counter[str] = Counter()

    def snapshot(self) -> AnalysisSnapshot:
        """The analysis so far, detached from it."""
        usage = [(provider, model, dict(totals)) for (provider, model), totals in self.usage.items()]
        return AnalysisSnapshot([dict(turn) for turn in self.turns], self.steps, self.request_count, usage,
                                dict(self.end_reasons), self.boundaries.to_json())

    def restore(self, saved: AnalysisSnapshot) -> None:
        """Take back the analysis :meth:`snapshot` saved. An instance method,
        unlike the fold state's: the callbacks and options are the caller's."""
        self.turns = [dict(turn) for turn in saved.turns]
        self.steps, self.request_count = saved.steps, saved.request_count
        self.usage = {(provider, model): Counter(totals) for provider, model, totals in saved.usage}
        self.end_reasons = Counter(saved.end_reasons)
        self.boundaries = BoundaryTracker.from_json(saved.boundaries)

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
        if self.count_requests and event["type"] in _REQUEST_TYPES and isinstance(data, dict):
            self._request(self.boundaries.observe(event["type"], event["seq"], data), state)

    def after_event(self, event: dict[str, Any], state: SessionState) -> None:
        event_type, data = event["type"], event["data"]
        if not isinstance(data, dict):  # the fold admits any JSON value here; it says nothing to count
            return
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
            if self.on_turn_end is not None:
                self.on_turn_end(reason)
        elif event_type == "assistant/message":
            usage = data.get("usage")
            source = data["message"]["source"]
            if isinstance(usage, dict):
                provider, model = str(source.get("provider")), str(source.get("model"))
                totals = self.usage.setdefault((provider, model), Counter())
                counted = {name: usage[name] for name in _USAGE_FIELDS if type(usage.get(name)) is int}
                totals.update(counted)
                if self.on_usage is not None:
                    self.on_usage(provider, model, counted)

    def chunk_run(self, row: ChunkRow, state: SessionState) -> None:
        if not self.count_requests:
            return
        self._request(self.boundaries.observe_delta_run(row.turn, row.step, row.seq0), state)
