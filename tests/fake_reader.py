"""An in-memory :class:`~consumers.projector.reader.ViewReader` over session
dicts, findings and dead letters, for tests of what reads the view store
(the read API, the viewer) without a store.

It answers as :class:`~consumers.projector.store_reader.StoreReader` does:
every filter, the same order (sessions most recently active first, ties by
id descending; findings and dead letters newest first, ties by id
descending), keyset cursors, and a ``ValueError`` naming a cursor it never
gave. A session dict has the shape ``ViewReader.session`` returns; its
``findings`` and ``findingCount`` are computed from the findings given.
"""

from __future__ import annotations

import base64
import collections
import json
from typing import Any, Callable, Iterable, Sequence

from consumers.projector.reader import DeadLetterFilter, FindingFilter, SessionFilter
from consumers.projector.gateway_requests import placed
from consumers.projector.session_costs import UNPRICED, ModelPrice, cost_usd
from consumers.projector.session_pages import NAMING_TURNS, page_of, timed_turns, turn_of
from consumers.projector.store import TOKEN_COLUMNS, message_texts

__all__ = ["SUMMARY_FIELDS", "FakeReader"]

#: The fields of a session summary (``sessions`` items).
SUMMARY_FIELDS = ("sessionId", "status", "cwd", "createdAt", "lastActivity", "turnCount", "messageCount", "models",
                  "findingCount", "error", "ingestedAt", "lagMs", "tokens")
#: The sort key of each order of sessions.
_ORDERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "activity": lambda s: s["lastActivity"] or 0, "created": lambda s: s["createdAt"] or 0,
    "tokens": lambda s: s["tokens"]}
_HOUR_MS = 3_600_000
#: A session's fields a page holds only a part of.
_PAGED = ("messages", "messageSeqs", "surface", "requestHeaderChanges", "findings", "turns", "steps",
          "gatewayRequests", "modelOrder")


class FakeReader:
    """The views of ``sessions``, ``findings`` and ``dead_letters`` (dicts of
    the shapes :class:`ViewReader` documents), held in memory."""

    def __init__(self, sessions: Iterable[dict[str, Any]], findings: Iterable[dict[str, Any]] = (),
                 dead_letters: Iterable[dict[str, Any]] = ()) -> None:
        self._findings = sorted(findings, key=lambda f: (f["at"], f["id"]), reverse=True)
        self._letters = sorted(dead_letters, key=lambda letter: (letter["at"], letter["id"]), reverse=True)
        counts = collections.Counter(finding["sessionId"] for finding in self._findings)
        self._sessions = {}
        for session in sessions:
            session_id = session["sessionId"]
            tokens = sum(model.get(column, 0) for model in session["models"] for column in TOKEN_COLUMNS)
            self._sessions[session_id] = {"ingestedAt": None, "lagMs": None, "tokens": tokens, "steps": [],
                                          **session, "findingCount": counts[session_id],
                                          "findings": [f for f in self._findings if f["sessionId"] == session_id]}

    def sessions(self, where: SessionFilter, cursor: str | None = None, limit: int = 50,
                 order: str = "activity", prices: Sequence[ModelPrice] | None = None) -> dict[str, Any]:
        costs = {session_id: _cost_key(session, prices or ()) for session_id, session in self._sessions.items()}
        value = (lambda s: costs[s["sessionId"]]) if order == "cost" else _ORDERS[order]
        chosen = sorted((s for s in self._sessions.values() if _session_matches(s, where)),
                        key=lambda s: (value(s), s["sessionId"]), reverse=True)
        return _page(f"sessions-{order}", chosen, lambda s: [value(s), s["sessionId"]], cursor, limit,
                     lambda s: {field: s[field] for field in SUMMARY_FIELDS}
                     | ({"costUsd": cost_usd(costs[s["sessionId"]])} if prices is not None else {}))

    def session(self, session_id: str) -> dict[str, Any] | None:
        return self._sessions.get(session_id)

    def session_page(self, session_id: str, after: int | None = None, limit: int = 100) -> dict[str, Any] | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        facts = {key: value for key, value in session.items() if key not in _PAGED}
        rows = [row for row in sorted(_rows(session)) if after is None or row[0] > after]
        before = [data for seq, kind, data, _ in sorted(_rows(session)) if after is not None and seq <= after
                  and kind in NAMING_TURNS]
        page = page_of({**facts, "surfaceCount": len(session["surface"])}, rows, after, limit,
                       session["requestHeaderChanges"],
                       sorted(session["findings"], key=lambda f: f["seq"] if isinstance(f["seq"], int) else -1),
                       session["turns"], turn_of(before[-1]) if before else None, session.get("modelOrder"))
        numbers = {turn.get("turn") for turn in page["turns"]}
        steps = [step for step in session["steps"] if step["turn"] in numbers]
        return page | {"turns": timed_turns(page["turns"], steps),
                       "steps": placed(steps, session.get("gatewayRequests") or [])}

    def surface_event(self, session_id: str, seq: int) -> dict[str, Any] | None:
        session = self._sessions.get(session_id)
        return next((e for e in session["surface"] if e["seq"] == seq), None) if session else None

    def resolve(self, prefix: str) -> list[str]:
        return sorted(session_id for session_id in self._sessions if session_id.startswith(prefix))[:10]

    def findings(self, where: FindingFilter, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        chosen = [f for f in self._findings if _equal(f, rule=where.rule, severity=where.severity,
                                                      sessionId=where.session_id)
                  and _within(f["at"], where.since, where.until)]
        return _page("findings", chosen, lambda f: [f["at"], f["id"]], cursor, limit)

    def dead_letters(self, where: DeadLetterFilter, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        chosen = [letter for letter in self._letters
                  if _equal(letter, service=where.service, reason=where.reason, sessionId=where.session_id)]
        return _page("dead-letters", chosen, lambda letter: [letter["at"], letter["id"]], cursor, limit)

    def dead_letter(self, letter_id: int) -> dict[str, Any] | None:
        return next((letter for letter in self._letters if letter["id"] == letter_id), None)

    def summary(self) -> dict[str, Any]:
        statuses = collections.Counter(session["status"] for session in self._sessions.values())
        tokens: dict[tuple[int, str, str], dict[str, int]] = collections.defaultdict(
            lambda: dict.fromkeys(TOKEN_COLUMNS, 0))
        for session in self._sessions.values():  # a step's tokens in the hour it ended; without steps, the session's
            timed = [(step["endedAt"] if step["endedAt"] is not None else step["startedAt"], step)
                     for step in session["steps"] if step["model"] is not None]
            if not session["steps"] and session["lastActivity"] is not None:
                timed = [(session["lastActivity"], model) for model in session["models"]]
            for at, usage in timed:
                if at is None:
                    continue
                totals = tokens[(at // _HOUR_MS * _HOUR_MS, usage["provider"], usage["model"])]
                for column in TOKEN_COLUMNS:
                    totals[column] += usage.get(column, 0)
        return {"sessionsByStatus": dict(sorted(statuses.items())),
                "tokensByModelPerHour": [{"hour": hour, "provider": provider, "model": model, **sums}
                                         for (hour, provider, model), sums in sorted(tokens.items())]}


def _rows(session: dict[str, Any]) -> list[tuple[int, str, Any, int | None]]:
    return [(event["seq"], event["type"], event["data"], event.get("time")) for event in session["surface"]]


def _session_matches(session: dict[str, Any], where: SessionFilter) -> bool:
    models = session["models"]
    texts = (text.lower() for message in session["messages"] for text in message_texts(message))
    return ((where.status is None or session["status"] in where.status)
            and (where.provider is None or any(m["provider"] == where.provider for m in models))
            and (where.model is None or any(m["model"] == where.model for m in models))
            and (where.cwd is None or session["cwd"] is not None and session["cwd"].startswith(where.cwd))
            and _within(session["createdAt"], where.created_from, where.created_to)
            and _within(session["lastActivity"], where.active_from, where.active_to)
            and (where.has_findings is None or (session["findingCount"] > 0) == where.has_findings)
            and (not where.text or any(where.text.lower() in text for text in texts)))


def _within(value: int | None, start: int | None, end: int | None) -> bool:
    """``start <= value < end`` for the bounds given (an absent value is in no range, as NULL in SQL)."""
    if start is None and end is None:
        return True
    return value is not None and (start is None or value >= start) and (end is None or value < end)


def _equal(item: dict[str, Any], **wanted: Any) -> bool:
    return all(value is None or item[field] == value for field, value in wanted.items())


def _cost_key(session: dict[str, Any], prices: Sequence[ModelPrice]) -> float:
    """A session's cost at ``prices`` as the store's query gives it
    (:mod:`consumers.projector.session_costs`)."""
    table = {(price.provider, price.model): price for price in prices}
    total = 0.0
    for row in session["models"]:
        price = table.get((row["provider"], row["model"])) or table.get((None, row["model"]))
        if price is None:
            return UNPRICED
        rates = (price.input, price.cache_read, price.cache_write, price.output,
                 price.output if price.reasoning is None else price.reasoning)
        total += sum(max(row.get(column, 0), 0) * rate for column, rate in zip(
            ("inputTokens", "cacheReadTokens", "cacheWriteTokens", "outputTokens", "reasoningTokens"), rates))
    return total / 1_000_000


def _page(listing: str, chosen: list[dict[str, Any]], key: Callable[[dict[str, Any]], list[Any]],
          cursor: str | None, limit: int, shown: Callable[[dict[str, Any]], dict[str, Any]] = dict) -> dict[str, Any]:
    """``limit`` items of ``chosen`` (sorted by ``key``, descending) after
    the cursor's key, and the cursor of the last one if more follow (a
    cursor names its listing: one of another listing is refused)."""
    if cursor is not None:
        after = _cursor_key(cursor, listing)
        chosen = [item for item in chosen if key(item) < after]
    page = chosen[:limit]
    more = len(chosen) > limit
    return {"items": [shown(item) for item in page],
            "next": base64.urlsafe_b64encode(json.dumps([listing, *key(page[-1])]).encode()).decode() if more
            else None}


def _cursor_key(cursor: str, listing: str) -> list[Any]:
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError:  # not base64, not UTF-8, not JSON
        key = None
    if isinstance(key, list) and len(key) == 3 and key[0] == listing:
        return key[1:]
    if isinstance(key, list) and len(key) == 3 and listing.startswith("sessions-") and \
            f"{key[0]}".startswith("sessions-"):
        given, order = key[0].removeprefix("sessions-"), listing.removeprefix("sessions-")
        raise ValueError(f"cursor {cursor!r} pages the sessions by {given!r}, not by {order!r}: start {order!r} "
                         "from its first page")
    raise ValueError(f"cursor {cursor!r} is not one this reader gave")
