"""The auditor's fold observer: request boundaries and the invariants of
docs/formats/v0.md §7.1, reported to a session's :class:`~.findings.Report`."""

from __future__ import annotations

from typing import Any, Callable

from dsh_core.invariants import InvariantChecker
from dsh_core.request import Boundary, BoundaryTracker
from dsh_core.session import SessionState
from dsh_core.storage.records import ChunkRow

from .findings import Report

__all__ = ["BoundaryAudit"]

_INVARIANT_TYPES = frozenset({"turn/start", "turn/end", "step/start", "step/end", "assistant/chunk",
                              "assistant/message", "tool/call", "tool/result", "todo/write", "request/header",
                              "request/context"})
_BOUNDARY_TYPES = frozenset({"assistant/chunk", "assistant/message", "assistant/attempt"})


class BoundaryAudit:
    """Checks each request boundary that no attestation covers (``attested``,
    shared with the session), handing it to ``on_request`` too, and every
    invariant."""

    watched_types = _INVARIANT_TYPES | _BOUNDARY_TYPES

    def __init__(self, report: Report, attested: set[int], boundaries: BoundaryTracker | None = None,
                 invariants: InvariantChecker | None = None,
                 on_request: Callable[[Boundary, SessionState], None] | None = None) -> None:
        self.report = report
        self.on_request = on_request
        self.attested = attested
        self.boundaries = boundaries or BoundaryTracker()
        self.invariants = invariants or InvariantChecker()

    def _boundary(self, boundary: Boundary | None, state: SessionState) -> None:
        if boundary is None or boundary.seq in self.attested:
            return
        if state.header is None:
            self.report.finding("no-request-header", boundary.seq, "a model request with no request/header in force",
                                boundary.turn, boundary.step)
        elif state.message_count() == 0:
            self.report.finding("empty-history", boundary.seq, "a model request with no derived messages",
                                boundary.turn, boundary.step)
        if self.on_request is not None:
            self.on_request(boundary, state)

    def before_event(self, event: dict[str, Any], state: SessionState) -> None:
        if event["type"] in _BOUNDARY_TYPES and isinstance(event["data"], dict):
            self._boundary(self.boundaries.observe(event["type"], event["seq"], event["data"]), state)

    def after_event(self, event: dict[str, Any], state: SessionState) -> None:
        for violation in self.invariants.check(event["type"], event["seq"], event["data"],
                                               event.get("surfaceOp", "append")):
            self.report.finding(f"invariant:{violation.rule}", violation.seq, violation.detail, violation.turn,
                                violation.step)

    def chunk_run(self, row: ChunkRow, state: SessionState) -> None:
        self._boundary(self.boundaries.observe_delta_run(row.turn, row.step, row.seq0), state)
        for violation in self.invariants.check_chunk_run(row.turn, row.step, row.seq0, row.event_count):
            self.report.finding(f"invariant:{violation.rule}", violation.seq, violation.detail, violation.turn,
                                violation.step)
