"""The view store read, never written: :class:`StoreReader` is the
:class:`~consumers.projector.reader.ViewReader` of a store the projector
keeps, on any backend of :mod:`~consumers.runtime.store_backends`.

A reader opens an existing store only (a missing SQLite file is an error
naming the path, not a new empty store) of the layout this build writes.
Pages are keyset-paginated (the cursor is the last row's sort key), so a
page costs the same at any depth.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any, Sequence

from dsh_core.errors import DshError
from dsh_core.fold_snapshot import restore_fold
from dsh_core.jsonvalue import MAX_SAFE_INTEGER, decode_json, thaw

from ..runtime.errors import StateStoreError
from ..runtime.store_backends import backend_of
from ..runtime.stored_text import stored_text
from .reader import DeadLetterFilter, FindingFilter, SessionFilter
from .gateway_requests import placed, requests_during
from .session_costs import ModelPrice, cost_column, cost_usd
from .session_pages import NAMING_TURNS, page_of, step_of, timed_turns, turn_of
from .store import LAYOUT, TOKEN_COLUMNS
from .timings import STEP_COLUMNS

__all__ = ["StoreReader", "LETTER_ID_BASE"]

#: A dead letter's id: its partition times this, plus its offset.
LETTER_ID_BASE = 1 << 40
_HEAD_BYTES = 256


class StoreReader:
    """Reads of one view store (``location``: a path or a backend's URI)."""

    def __init__(self, location: Path | str) -> None:
        self.reading = backend_of(location).open_reading(location)
        self.where = self.reading.where
        try:
            found = self._rows("SELECT kind, version FROM dsh_layout")
        except StateStoreError as error:
            self.close()
            raise StateStoreError(f"{self.where}: not a view store in layout {LAYOUT} ({error.message})") from None
        if [tuple(row) for row in found] != [("view-store", LAYOUT)]:
            self.close()
            raise StateStoreError(f"{self.where}: not a view store in layout {LAYOUT} (found {found}); start the "
                                  f"projector of this version on it once to migrate it")

    def _rows(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple]:
        """The rows of one query; a store that cannot answer is a
        :class:`StateStoreError` naming it."""
        return self.reading.rows(statement, parameters)

    def close(self) -> None:
        self.reading.close()

    # ------------------------------------------------------------ sessions

    def sessions(self, where: SessionFilter, cursor: str | None = None, limit: int = 50,
                 order: str = "activity", prices: Sequence[ModelPrice] | None = None) -> dict[str, Any]:
        conditions, parameters = _session_conditions(where)
        if order == "cost" and prices is None:
            raise TypeError("listing sessions by cost needs the prices to cost them at")
        with_, join, cost, priced = cost_column(prices or ()) if order == "cost" else ("", "", "", [])
        key = cost if order == "cost" else _SESSION_ORDERS[order]
        listed = (f"{with_}SELECT * FROM (SELECT s.session_id, s.status, s.cwd, s.created_at, s.last_activity, "
                  f"s.turn_count, s.message_count, {_FINDING_COUNT} AS findings, s.error, s.ingested_at, s.tokens, "
                  f"{key} AS sort_key FROM sessions s {join}"
                  + (" WHERE " + " AND ".join(conditions) if conditions else "") + ") AS listed")
        if cursor is not None:
            value, session_id = _session_cursor(cursor, order)
            listed += " WHERE (sort_key < ? OR (sort_key = ? AND session_id < ?))"
            parameters += [value, value, session_id]
        rows = self._rows(listed + " ORDER BY sort_key DESC, session_id DESC LIMIT ?",
                          [*priced, *parameters, limit + 1])
        page = rows[:limit]
        models = self._models([row[0] for row in page])
        costs = {row[0]: row[-1] for row in page} if order == "cost" else \
            self._costs([row[0] for row in page], prices) if prices is not None else {}
        items = [{"sessionId": session_id, "status": status, "cwd": cwd, "createdAt": created, "lastActivity": active,
                  "turnCount": turns, "messageCount": messages, "findingCount": findings, "error": error,
                  "models": models.get(session_id, []), **_ingestion(ingested, active), "tokens": tokens,
                  **({"costUsd": cost_usd(costs[session_id])} if prices is not None else {})}
                 for session_id, status, cwd, created, active, turns, messages, findings, error, ingested, tokens, _
                 in page]
        last = page[-1] if len(rows) > limit else None
        return {"items": items, "next": _make_cursor(order, last[-1], last[0]) if last else None}

    def _costs(self, session_ids: list[str], prices: Sequence[ModelPrice]) -> dict[str, float | int]:
        """The cost keys (:mod:`.session_costs`) of these sessions."""
        if not session_ids:
            return {}
        with_, join, cost, priced = cost_column(prices, among=len(session_ids))
        marks = ", ".join("?" * len(session_ids))
        return dict(self._rows(f"{with_}SELECT s.session_id, {cost} FROM sessions s {join} WHERE s.session_id IN "
                               f"({marks})", [*priced, *session_ids, *session_ids]))

    def _models(self, session_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        if not session_ids:
            return {}
        models: dict[str, list[dict[str, Any]]] = {}
        for session_id, provider, model, *tokens in self._rows(
                f"SELECT session_id, provider, model, {', '.join(TOKEN_COLUMNS)} FROM usage WHERE session_id IN "
                f"({', '.join('?' * len(session_ids))}) ORDER BY session_id, provider, model", session_ids):
            models.setdefault(session_id, []).append({"provider": provider, "model": model,
                                                      **dict(zip(TOKEN_COLUMNS, tokens))})
        return models

    def session(self, session_id: str) -> dict[str, Any] | None:
        rows = self._rows(f"SELECT s.view, s.snapshot, {_FINDING_COUNT}, s.last_activity, s.ingested_at, s.tokens "
                          "FROM sessions s WHERE s.session_id = ?", (session_id,))
        if not rows:
            return None
        view_text, snapshot, finding_count, last_activity, ingested, tokens = rows[0]
        view = decode_json(view_text)
        timed = [(seq, kind, decode_json(data), time) for seq, kind, data, time in self._rows(
            "SELECT seq, type, data, event_time FROM surface WHERE session_id = ? ORDER BY seq", (session_id,))]
        surface = [(seq, kind, data) for seq, kind, data, _ in timed]
        steps = [step_of(row) for row in self._rows(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM steps WHERE session_id = ? ORDER BY turn, step", (session_id,))]
        steps = placed(steps, requests_during(self._rows, session_id, steps))
        messages: list[Any] = []
        if snapshot is not None:
            try:
                fold = restore_fold(bytes(snapshot), f"session {session_id!r}", None, surface)
                messages = thaw(fold.state.messages())
            except DshError as error:
                raise StateStoreError(f"{self.where}: the stored view does not restore ({error.message}); rebuild "
                                      "it (a new projector group) or delete the session") from None
        header = view.get("header") or {}
        audit = self._rows("SELECT counts FROM audit_verdicts WHERE session_id = ?", (session_id,))
        return {"sessionId": session_id, "status": view["status"], "cwd": header.get("cwd"),
                "createdAt": header.get("createdAt"), "lastActivity": last_activity,
                "turnCount": len(view.get("turns") or ()), "messageCount": len(messages),
                "findingCount": finding_count, "error": view.get("error"), "models": view.get("usage") or [],
                **_ingestion(ingested, last_activity), "tokens": tokens, "steps": steps,
                "header": header, "nextSeq": view["nextSeq"], "turns": timed_turns(view.get("turns") or [], steps),
                "requestHeader": view.get("requestHeader"), "replaceGeneration": view.get("replaceGeneration", 0),
                "requestHeaderChanges": view.get("requestHeaderChanges") or [], "modelOrder": view.get("modelOrder"),
                "messages": messages, "messageSeqs": _message_seqs(surface),
                "surface": [{"seq": seq, "type": kind, "data": data, "time": time} for seq, kind, data, time in timed],
                "findings": self.findings(FindingFilter(session_id=session_id), limit=10_000)["items"],
                "audit": decode_json(audit[0][0]) if audit else None}

    def session_page(self, session_id: str, after: int | None = None, limit: int = 100) -> dict[str, Any] | None:
        """One page of a session (:mod:`.session_pages`): its stored facts and
        totals, and at most ``limit`` surface events above ``after``, read
        by seq with no more rows than the page holds."""
        rows = self._rows(f"SELECT s.view, s.status, s.message_count, s.last_activity, {_FINDING_COUNT}, "
                          "(SELECT COUNT(*) FROM surface e WHERE e.session_id = s.session_id), s.ingested_at, "
                          "s.tokens FROM sessions s WHERE s.session_id = ?", (session_id,))
        if not rows:
            return None
        view_text, status, message_count, last_activity, finding_count, surface_count, ingested, tokens = rows[0]
        view = decode_json(view_text)
        header = view.get("header") or {}
        audit = self._rows("SELECT counts FROM audit_verdicts WHERE session_id = ?", (session_id,))
        facts = {"sessionId": session_id, "status": status, "cwd": header.get("cwd"),
                 "createdAt": header.get("createdAt"), "lastActivity": last_activity,
                 "turnCount": len(view.get("turns") or ()), "messageCount": message_count,
                 "surfaceCount": surface_count, "findingCount": finding_count, "error": view.get("error"),
                 "models": self._models([session_id]).get(session_id, []), "header": header,
                 "nextSeq": view["nextSeq"], "requestHeader": view.get("requestHeader"),
                 "replaceGeneration": view.get("replaceGeneration", 0),
                 "audit": decode_json(audit[0][0]) if audit else None, **_ingestion(ingested, last_activity),
                 "tokens": tokens}
        start = -1 if after is None else after
        events = [(seq, kind, decode_json(data), time) for seq, kind, data, time in self._rows(
            "SELECT seq, type, data, event_time FROM surface WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (session_id, start, limit + 1))]
        high = events[limit - 1][0] if len(events) > limit else 2 ** 63 - 1
        findings = self._session_findings(session_id, start, high, with_unnumbered=after is None)
        before = self._rows(f"SELECT data FROM surface WHERE session_id = ? AND seq <= ? AND type IN "
                            f"({', '.join('?' * len(NAMING_TURNS))}) ORDER BY seq DESC LIMIT 1",
                            (session_id, after, *NAMING_TURNS)) if after is not None else []
        page = page_of(facts, events, after, limit, view.get("requestHeaderChanges") or (), findings,
                       view.get("turns") or (), turn_of(decode_json(before[0][0])) if before else None,
                       view.get("modelOrder"))
        numbers = [turn["turn"] for turn in page["turns"] if isinstance(turn.get("turn"), int)]
        steps = [step_of(row) for row in self._rows(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM steps WHERE session_id = ? AND turn >= ? AND turn <= ? "
            "ORDER BY turn, step", (session_id, min(numbers), max(numbers)))] if numbers else []
        return page | {"turns": timed_turns(page["turns"], steps),
                       "steps": placed(steps, requests_during(self._rows, session_id, steps))}

    def _session_findings(self, session_id: str, low: int, high: int, with_unnumbered: bool) -> list[dict[str, Any]]:
        """A session's findings of seqs ``low < seq <= high`` (and those of
        no seq), in seq order."""
        rows = self._rows(
            "SELECT at, partition, \"offset\", rule, severity, seq, turn, step, detail FROM findings "
            "WHERE session_id = ? AND ((seq > ? AND seq <= ?)" + (" OR seq IS NULL" if with_unnumbered else "")
            + ") ORDER BY seq, at, partition, \"offset\"", (session_id, low, high))
        return [{"id": f"{partition}-{offset}", "at": at, "sessionId": session_id, "rule": rule, "severity": severity,
                 "seq": seq, "turn": turn, "step": step, "detail": detail}
                for at, partition, offset, rule, severity, seq, turn, step, detail in rows]

    def surface_event(self, session_id: str, seq: int) -> dict[str, Any] | None:
        """One surface event of a session, whole: ``{"seq", "type", "data", "time"}``."""
        rows = self._rows("SELECT seq, type, data, event_time FROM surface WHERE session_id = ? AND seq = ?",
                          (session_id, seq))
        return {"seq": rows[0][0], "type": rows[0][1], "data": decode_json(rows[0][2]), "time": rows[0][3]} \
            if rows else None

    def session_exists(self, session_id: str) -> bool:
        return bool(self._rows("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)))

    def resolve(self, prefix: str) -> list[str]:
        return [row[0] for row in self._rows(
            "SELECT session_id FROM sessions WHERE substr(session_id, 1, ?) = ? ORDER BY session_id LIMIT 10",
            (len(stored_text(prefix)), prefix))]

    # ------------------------------------------------- findings, dead letters

    def findings(self, where: FindingFilter, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        conditions, parameters = _conditions((("rule = ?", where.rule), ("severity = ?", where.severity),
                                              ("session_id = ?", where.session_id), ("at >= ?", where.since),
                                              ("at < ?", where.until)))
        rows = self._keyset("SELECT at, partition, \"offset\", session_id, rule, severity, seq, turn, step, detail "
                            "FROM findings", conditions, parameters, cursor, limit)
        items = [{"id": f"{partition}-{offset}", "at": at, "sessionId": session_id, "rule": rule, "severity": severity,
                  "seq": seq, "turn": turn, "step": step, "detail": detail}
                 for at, partition, offset, session_id, rule, severity, seq, turn, step, detail in rows[:limit]]
        return _page(items, rows, limit)

    def dead_letters(self, where: DeadLetterFilter, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        conditions, parameters = _conditions((("d.service = ?", where.service), ("d.reason = ?", where.reason),
                                              ("d.session_id = ?", where.session_id)))
        # One letter per record and reason, the first of those matching: every service and consumer group
        # that refused the record wrote one.
        conditions.append("NOT EXISTS (SELECT 1 FROM dead_letters e WHERE " + _SAME_RECORD.format(alias="e")
                          + (" AND e.service = ?" if where.service is not None else "")
                          + " AND (e.partition < d.partition OR (e.partition = d.partition "
                            "AND e.\"offset\" < d.\"offset\")))")
        parameters += [where.service] if where.service is not None else []
        rows = self._keyset(f"SELECT d.at, d.partition, d.\"offset\", {_LETTER_COLUMNS} FROM dead_letters d",
                            conditions, parameters, cursor, limit, alias="d.")
        return _page([_letter(row) for row in rows[:limit]], rows, limit)

    def dead_letter(self, letter_id: int) -> dict[str, Any] | None:
        partition, offset = divmod(letter_id, LETTER_ID_BASE)
        rows = self._rows(f"SELECT d.at, d.partition, d.\"offset\", {_LETTER_COLUMNS} FROM dead_letters d "
                          "WHERE d.partition = ? AND d.\"offset\" = ?", (partition, offset))
        return _letter(rows[0]) if rows else None

    def _keyset(self, select: str, conditions: list[str], parameters: list[Any], cursor: str | None,
                limit: int, alias: str = "") -> list[tuple]:
        """Rows newest first: ``at``, then partition and offset, descending
        (of the table ``alias`` names, when the query has several)."""
        at_, partition_, offset_ = (f"{alias}{column}" for column in ("at", "partition", "\"offset\""))
        if cursor is not None:
            at, partition, offset = _cursor(cursor, numbers=3)
            conditions.append(f"({at_} < ? OR ({at_} = ? AND ({partition_} < ? OR ({partition_} = ? AND "
                              f"{offset_} < ?))))")
            parameters += [at, at, partition, partition, offset]
        return self._rows(select + (" WHERE " + " AND ".join(conditions) if conditions else "")
                          + f" ORDER BY {at_} DESC, {partition_} DESC, {offset_} DESC LIMIT ?",
                          [*parameters, limit + 1])

    # ------------------------------------------------------------- summary

    def counts(self) -> dict[str, int]:
        """How many sessions, findings and dead letters the store holds."""
        return {key: self._rows(f"SELECT COUNT(*) FROM {table}")[0][0] for key, table in (
            ("sessions", "sessions"), ("findings", "findings"), ("deadLetters", "dead_letters"))}

    def summary(self) -> dict[str, Any]:
        statuses = {status: count for status, count in self._rows(
            "SELECT status, COUNT(*) FROM sessions GROUP BY status ORDER BY status")}
        # A step's tokens count in the hour it ended; a session with no step rows (kept by an older
        # layout, not rebuilt) counts its tokens in the hour of its last activity.
        hours = self._rows(
            "SELECT hour, provider, model, " + ", ".join(f"SUM({column})" for column in TOKEN_COLUMNS)
            + " FROM (SELECT (COALESCE(t.ended_at, t.started_at) / 3600000) * 3600000 AS hour, t.provider, t.model, "
            + ", ".join(f"t.{column} AS {name}" for column, name in zip(STEP_COLUMNS[7:], TOKEN_COLUMNS))
            + " FROM steps t WHERE t.model IS NOT NULL AND COALESCE(t.ended_at, t.started_at) IS NOT NULL "
            "UNION ALL SELECT (s.last_activity / 3600000) * 3600000, u.provider, u.model, "
            + ", ".join(f"u.{column}" for column in TOKEN_COLUMNS)
            + " FROM usage u JOIN sessions s ON s.session_id = u.session_id WHERE s.last_activity IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM steps t WHERE t.session_id = s.session_id)) AS timed "
            "GROUP BY hour, provider, model ORDER BY hour, provider, model")
        return {"sessionsByStatus": statuses,
                "tokensByModelPerHour": [{"hour": hour, "provider": provider, "model": model,
                                          **{column: int(total or 0) for column, total in zip(TOKEN_COLUMNS, totals)}}
                                         for hour, provider, model, *totals in hours]}


def _message_seqs(surface: list[tuple[int, str, Any]]) -> dict[str, int]:
    """The seq of the surface event each derived message comes from, by message id."""
    seqs: dict[str, int] = {}
    for seq, _, data in surface:
        if isinstance(data, dict):
            inner = data.get("message")
            message = inner if isinstance(inner, dict) else data
            if isinstance(message.get("id"), str):
                seqs[message["id"]] = seq
    return seqs


_FINDING_COUNT = "(SELECT COUNT(*) FROM findings f WHERE f.session_id = s.session_id)"
#: What ``sessions`` can list by (descending, then by id): the key of each.
_SESSION_ORDERS = {"activity": "COALESCE(s.last_activity, 0)", "created": "COALESCE(s.created_at, 0)",
                   "tokens": "s.tokens"}


def _ingestion(ingested: int | None, active: int | None) -> dict[str, int | None]:
    """When a session's last record reached the topic, and how long after
    its last event time (its lag; a backfill's is its age when shipped)."""
    return {"ingestedAt": ingested,
            "lagMs": ingested - active if ingested is not None and active is not None else None}
#: The letters of the letter ``d``'s record (where it was first read) and reason.
_SAME_RECORD = ("{alias}.source_topic = d.source_topic AND {alias}.source_partition = d.source_partition "
                "AND {alias}.source_offset = d.source_offset AND {alias}.reason = d.reason")
_LETTER_COLUMNS = ("d.service, d.reason, d.detail, d.source_topic, d.source_partition, d.source_offset, d.session_id, "
                   "d.seq, d.size, d.head, (SELECT COUNT(*) FROM dead_letters c WHERE "
                   + _SAME_RECORD.format(alias="c") + ")")


def _letter(row: tuple) -> dict[str, Any]:
    at, partition, offset, service, reason, detail, topic, source_partition, source_offset, session_id, seq, size, \
        head, copies = row
    return {"id": partition * LETTER_ID_BASE + offset, "at": at, "service": service, "reason": reason,
            "detail": detail, "topic": topic, "partition": source_partition, "offset": source_offset,
            "sessionId": session_id, "seq": seq, "size": size,
            "head": bytes(head).decode("utf-8", "backslashreplace"), "copies": max(copies, 1)}


def _session_conditions(where: SessionFilter) -> tuple[list[str], list[Any]]:
    conditions, parameters = _conditions((
        ("s.created_at >= ?", where.created_from), ("s.created_at < ?", where.created_to),
        ("s.last_activity >= ?", where.active_from), ("s.last_activity < ?", where.active_to),
        ("EXISTS (SELECT 1 FROM usage u WHERE u.session_id = s.session_id AND u.provider = ?)", where.provider),
        ("EXISTS (SELECT 1 FROM usage u WHERE u.session_id = s.session_id AND u.model = ?)", where.model)))
    if where.status:
        conditions.append(f"s.status IN ({', '.join('?' * len(where.status))})")
        parameters += list(where.status)
    if where.cwd is not None:
        conditions.append("substr(s.cwd, 1, ?) = ?")
        parameters += [len(stored_text(where.cwd)), where.cwd]  # substr counts the stored characters
    if where.has_findings is not None:
        conditions.append(("" if where.has_findings else "NOT ")
                          + "EXISTS (SELECT 1 FROM findings f WHERE f.session_id = s.session_id)")
    if where.text:
        conditions.append("EXISTS (SELECT 1 FROM surface x WHERE x.session_id = s.session_id "
                          "AND x.text LIKE ? ESCAPE '!')")
        escaped = where.text.lower().replace("!", "!!").replace("%", "!%").replace("_", "!_")
        parameters.append(f"%{escaped}%")
    return conditions, parameters


def _conditions(pairs: tuple[tuple[str, Any], ...]) -> tuple[list[str], list[Any]]:
    """The conditions whose value is given, and their values."""
    given = [(condition, value) for condition, value in pairs if value is not None]
    return [condition for condition, _ in given], [value for _, value in given]


def _page(items: list[dict[str, Any]], rows: list[tuple], limit: int) -> dict[str, Any]:
    last = rows[limit - 1] if len(rows) > limit else None
    return {"items": items, "next": _make_cursor(*last[:3]) if last else None}


def _make_cursor(*key: Any) -> str:
    return base64.urlsafe_b64encode("\x1f".join(str(part) for part in key).encode()).decode()


def _session_cursor(text: str, order: str) -> tuple[float | int, str]:
    """A session list's cursor: its order's key and the session's id; a
    cursor of another order is a ``ValueError`` naming both."""
    given, value, session_id = _cursor(text, numbers=0, texts=3)
    if given != order:
        raise ValueError(f"cursor {text!r} pages the sessions by {given!r}, not by {order!r}: start {order!r} "
                         "from its first page")
    try:
        key = float(value) if order == "cost" else int(value)
    except ValueError:
        raise ValueError(f"cursor {text!r} is not one this store gave") from None
    if not math.isfinite(key) or abs(key) > MAX_SAFE_INTEGER:
        raise ValueError(f"cursor {text!r} is not one this store gave")
    return key, session_id


def _cursor(text: str, numbers: int, texts: int = 0) -> list[Any]:
    """A cursor's key: ``numbers`` integers, then ``texts`` strings; any
    other text is a ``ValueError`` naming it."""
    try:
        key = base64.urlsafe_b64decode(text.encode()).decode().split("\x1f")
        if len(key) == numbers + texts:
            values = [int(part) for part in key[:numbers]]
            if all(abs(value) <= MAX_SAFE_INTEGER for value in values):
                return values + key[numbers:]
    except (ValueError, UnicodeError):
        pass
    raise ValueError(f"cursor {text!r} is not one this store gave")
