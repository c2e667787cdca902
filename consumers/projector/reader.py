"""What readers of the view store ask it: the one read interface the CLI
readers, the read API and the web viewer use, whichever backend holds the
views (SQLite or PostgreSQL).

Results are plain JSON values (dicts, lists, str, int, None) so the API
returns them as they are. Times are milliseconds since the epoch, as dsh
writes them, and the times of a session's events are the log's own
(when dsh appended them); ``ingestedAt`` is when the session's last record
reached the topic, ``lagMs`` how long after its last event. A page is ``{"items": [...], "next": cursor or None}``; the
cursor is opaque text, given back as ``cursor`` for the next page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from .session_costs import ModelPrice

__all__ = ["DeadLetterFilter", "FindingFilter", "SESSION_ORDERS", "SessionFilter", "ViewReader", "STATUSES"]

#: A session's status in its view.
STATUSES = ("open", "idle", "held", "conflicted", "refused")
#: What sessions can be listed by, each descending: last activity, creation, tokens, cost.
SESSION_ORDERS = ("activity", "created", "tokens", "cost")


@dataclass(frozen=True, kw_only=True)
class SessionFilter:
    """Which sessions to list; every field ``None`` means no condition."""

    status: tuple[str, ...] | None = None  # any of these (STATUSES)
    provider: str | None = None  # used this provider in some assistant message
    model: str | None = None  # used this model in some assistant message
    cwd: str | None = None  # the header's cwd starts with this
    created_from: int | None = None  # header createdAt >= (ms)
    created_to: int | None = None  # header createdAt < (ms)
    active_from: int | None = None  # last event time >= (ms)
    active_to: int | None = None  # last event time < (ms)
    has_findings: bool | None = None  # the audit found something (True) or nothing (False)
    text: str | None = None  # a current message's text contains this (case-insensitive)


@dataclass(frozen=True, kw_only=True)
class FindingFilter:
    rule: str | None = None
    severity: str | None = None  # "error" or "warning"
    session_id: str | None = None
    since: int | None = None  # recorded at >= (ms)
    until: int | None = None  # recorded at < (ms)


@dataclass(frozen=True, kw_only=True)
class DeadLetterFilter:
    service: str | None = None  # "projector", "auditor", "archiver"
    reason: str | None = None  # the dead letter's category (invalid-log, corrupt-storage, ...)
    session_id: str | None = None


class ViewReader(Protocol):
    """Reads of the view store. Shapes of the JSON values:

    session summary (``sessions`` items)::

        {"sessionId", "status", "cwd", "createdAt", "lastActivity", "turnCount",
         "messageCount", "models": [{"provider", "model", "inputTokens", "outputTokens", ...}],
         "findingCount", "error", "ingestedAt", "lagMs", "tokens"}

    session (``session``): the summary's fields and ``header`` (dsh's header
    fields), ``turns`` (``[{"turn", "reason": {"kind", ...}, "seq", ...}]``),
    ``messages`` (the derived model-visible messages, identical to dsh's:
    ``[{"role", "content", ...}]``), ``surface`` (``[{"seq", "type",
    "data"}]`` the current surface events: system prompt, request header
    changes, compaction replaces), ``requestHeader`` (in force now),
    ``requestHeaderChanges`` (``[{"seq", "reason", "system", "toolsAdded",
    "toolsRemoved", "toolsChanged", "config", "configRemoved"}]``, one per
    ``request/header`` event, each with only what it changed:
    :func:`dsh_core.analysis.header_change`), ``replaceGeneration``
    (how often the history was replaced: compactions), ``messageSeqs``
    (``{message id: seq}`` of the surface event each message comes from),
    ``findings`` (as in ``findings``), ``audit`` (the auditor's verdict
    counts so far: ``{"attested": {verdict: n}, "wire": {kind: {verdict:
    n}}}``, ``None`` before it published any), ``modelOrder`` (``None``
    when the model sees the surface in seq order, else its runs ``[[first
    seq, last seq], ...]`` in the model's order:
    :func:`~consumers.projector.session_pages.model_order`).

    finding: ``{"id", "sessionId", "rule", "severity", "seq", "turn",
    "step", "detail", "at"}``.

    dead letter: ``{"id", "service", "reason", "detail", "topic",
    "partition", "offset", "sessionId", "seq", "at", "size", "head",
    "copies"}`` (``topic``, ``partition``, ``offset``: where the record was
    first read, also when it was redriven; ``head``: the first bytes of the
    record's value, as text with undecodable bytes escaped). A listing
    shows one letter per record and reason, however many services and
    consumer groups wrote one; ``copies`` says how many did.
    """

    def sessions(self, where: SessionFilter, cursor: str | None = None, limit: int = 50,
                 order: str = "activity", prices: Sequence[ModelPrice] | None = None) -> dict[str, Any]:
        """A page of session summaries, by ``order`` (:data:`SESSION_ORDERS`)
        descending: most recently active first by default. Given ``prices``,
        each carries ``costUsd`` (:mod:`~consumers.projector.session_costs`:
        ``None`` for a session using a model without a price), the key
        ``order="cost"`` (which needs them) lists by. A cursor of another
        order is a ``ValueError`` naming both."""

    def session(self, session_id: str) -> dict[str, Any] | None:
        """One session (``None``: not in the store)."""

    def session_page(self, session_id: str, after: int | None = None, limit: int = 100) -> dict[str, Any] | None:
        """A page of one session (:mod:`consumers.projector.session_pages`):
        the session's fields, ``surfaceCount``, and at most ``limit`` surface
        events above the seq ``after`` with their derived messages, header
        changes and findings, long texts cut to previews, each event with its
        ``time`` and its ``order`` (sorting the pages' events by ``(order,
        seq)`` gives the model's order); each step with ``gateway``, the
        requests a gateway attested while it ran (:mod:`.gateway_requests`); its turns with their ``startedAt``, ``endedAt``,
        ``durationMs`` and ``tokens``, and ``steps``, theirs: ``{"turn",
        "step", "startedAt", "firstOutputAt", "endedAt", "durationMs",
        "timeToFirstOutputMs", "provider", "model", "inputTokens", ...}``;
        ``next``, the cursor of the page after it (``None``: none).
        ``None``: not in the store."""

    def surface_event(self, session_id: str, seq: int) -> dict[str, Any] | None:
        """One surface event whole, ``{"seq", "type", "data", "time"}`` (``None``: no
        such session or seq)."""

    def resolve(self, prefix: str) -> list[str]:
        """The session ids starting with ``prefix`` (at most 10)."""

    def findings(self, where: FindingFilter, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        """A page of findings, newest first."""

    def dead_letters(self, where: DeadLetterFilter, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        """A page of dead letters, newest first."""

    def dead_letter(self, letter_id: int) -> dict[str, Any] | None:
        """One dead letter (``None``: no such id)."""

    def summary(self) -> dict[str, Any]:
        """``{"sessionsByStatus": {status: n}, "tokensByModelPerHour":
        [{"hour" (ms), "provider", "model", "inputTokens", "outputTokens"}]}``
        (a step's tokens count in the hour its last event happened)."""
