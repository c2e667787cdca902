"""What a loaded log says: turns, requests, token usage, request header
changes (a fold observer).

:class:`LogAnalysis` follows a load (see :mod:`dsh_core.formats.v0.fold`) and
collects the per-turn outcomes, every request attempt with its
reconstruction inputs, token usage by model, and what each
``request/header`` event changed (:func:`header_change`). With ``keep_requests``
off it only counts requests, so memory stays with the derived history.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import msgspec

from .jsonvalue import json_equal, thaw
from .request import Boundary, BoundaryTracker
from .session import SessionState
from .storage.records import ChunkRow

__all__ = ["AnalysisSnapshot", "LogAnalysis", "RequestRecord", "header_change"]

_USAGE_FIELDS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")

_REQUEST_TYPES = frozenset({"assistant/chunk", "assistant/attempt", "assistant/message"})


class RequestRecord(dict[str, Any]):
    """``{turn, step, attempt, boundarySeq, header, context, messages}``."""


class AnalysisSnapshot(msgspec.Struct, frozen=True):
    """What :meth:`LogAnalysis.snapshot` saves (kept requests are not saved)."""

    turns: list[dict[str, Any]]
    steps: int
    request_count: int
    usage: list[tuple[str, str, dict[str, int]]]  # (provider, model, token totals)
    end_reasons: dict[str, int]
    boundaries: list[Any]  # BoundaryTracker.to_json()
    header_changes: list[dict[str, Any]] = msgspec.field(default_factory=list)  # (none saved before they were kept)


class LogAnalysis:
    """Fold observer collecting turns, requests and usage."""

    _OUTCOME_TYPES = frozenset({"assistant/message", "turn/start", "step/start", "turn/end", "request/header"})

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
        self.header_changes: list[dict[str, Any]] = []  # {seq, reason, and what changed}, per request/header
        self._header_before: Any = None  # the header in force before the request/header being folded

    def snapshot(self) -> AnalysisSnapshot:
        """The analysis so far, detached from it."""
        usage = [(provider, model, dict(totals)) for (provider, model), totals in self.usage.items()]
        return AnalysisSnapshot([dict(turn) for turn in self.turns], self.steps, self.request_count, usage,
                                dict(self.end_reasons), self.boundaries.to_json(),
                                [dict(change) for change in self.header_changes])

    def restore(self, saved: AnalysisSnapshot) -> None:
        """Take back the analysis :meth:`snapshot` saved. An instance method,
        unlike the fold state's: the callbacks and options are the caller's."""
        self.turns = [dict(turn) for turn in saved.turns]
        self.steps, self.request_count = saved.steps, saved.request_count
        self.usage = {(provider, model): Counter(totals) for provider, model, totals in saved.usage}
        self.end_reasons = Counter(saved.end_reasons)
        self.boundaries = BoundaryTracker.from_json(saved.boundaries)
        self.header_changes = [dict(change) for change in saved.header_changes]

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
        if event["type"] == "request/header":
            self._header_before = state.header
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
        elif event_type == "request/header":
            self.header_changes.append({"seq": event["seq"], "reason": thaw(data.get("reason")),
                                        **header_change(self._header_before, state.header)})
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


def header_change(before: Any, after: Any) -> dict[str, Any]:
    """What changed from the request header ``before`` to ``after`` (folded
    headers; ``None``: none yet): ``system`` (the new prompt), ``toolsAdded``,
    ``toolsRemoved``, ``toolsChanged`` (by name), ``config`` (the settings
    set or changed, with their values) and ``configRemoved``; an unchanged
    part is left out. Values compare as JSON (a restored fold's header
    holds lists where a live one holds tuples)."""
    old, new = _mapping(before), _mapping(after)
    change: dict[str, Any] = {}
    if not json_equal(new.get("system"), old.get("system")):
        change["system"] = thaw(new.get("system"))
    old_tools, new_tools = _tools(old), _tools(new)
    for key, names in (("toolsAdded", [name for name in new_tools if name not in old_tools]),
                       ("toolsRemoved", [name for name in old_tools if name not in new_tools]),
                       ("toolsChanged", [name for name in new_tools
                                         if name in old_tools and not json_equal(new_tools[name], old_tools[name])])):
        if names:
            change[key] = names
    old_config, new_config = _mapping(old.get("config")), _mapping(new.get("config"))
    config = {key: thaw(value) for key, value in new_config.items()
              if key not in old_config or not json_equal(old_config[key], value)}
    if config:
        change["config"] = config
    removed = [key for key in old_config if key not in new_config]
    if removed:
        change["configRemoved"] = removed
    return change


def _mapping(value: Any) -> Any:
    return value if hasattr(value, "items") else {}


def _tools(header: Any) -> dict[str, Any]:
    tools = header.get("tools")
    return {tool["name"]: tool for tool in tools if hasattr(tool, "get") and isinstance(tool.get("name"), str)} \
        if isinstance(tools, (list, tuple)) else {}
