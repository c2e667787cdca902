"""The view store's tables (layout 9, documented in
docs/reference/view-store.md) and what their derived columns hold: a
surface row's searchable text (:func:`message_texts`), a session's listing
columns and usage rows. :mod:`.store` writes the rows, :mod:`.store_migrations`
brings an older layout to this one.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..runtime.database import DIGESTS_SCHEMA, HELD_SCHEMA
from .timings import STEP_COLUMNS, StepRow

__all__ = ["EVENT_TIMES", "GATEWAY_REQUESTS", "KIND", "LAYOUT", "SCHEMA", "SESSION_TABLES", "TOKEN_COLUMNS", "listing",
           "message_texts", "searchable", "session_tokens", "store_steps", "store_usage"]

KIND, LAYOUT = "view-store", 9
#: The sessions deleted (delete-session): their rows are gone and none is written again.
DELETED = "CREATE TABLE deleted_sessions (session_id TEXT PRIMARY KEY, at INTEGER NOT NULL)"
#: A record's dead letters, one per service (and consumer group) that refused it: readers show one per reason.
LETTERS_BY_SOURCE = ("CREATE INDEX dead_letters_by_source ON dead_letters (source_topic, source_partition, "
                     "source_offset, reason)")
SESSION_COLUMNS = ("cwd TEXT", "created_at INTEGER", "last_activity INTEGER", "turn_count INTEGER NOT NULL DEFAULT 0",
                   "message_count INTEGER NOT NULL DEFAULT 0")
TOKEN_COLUMNS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
LISTING = (
    "CREATE TABLE usage (session_id TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, "
    + ", ".join(f"{_column} INTEGER NOT NULL DEFAULT 0" for _column in TOKEN_COLUMNS)
    + ", PRIMARY KEY (session_id, provider, model))",
    # the listing's order (most recently active first) and its keyset cursor
    "CREATE INDEX sessions_by_activity ON sessions (COALESCE(last_activity, 0), session_id)",
    "CREATE INDEX sessions_by_status ON sessions (status, COALESCE(last_activity, 0), session_id)",
    "CREATE TABLE findings (topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, "
    "session_id TEXT NOT NULL, rule TEXT NOT NULL, severity TEXT NOT NULL, seq INTEGER, turn INTEGER, step INTEGER, "
    "detail TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))",
    "CREATE INDEX findings_by_session ON findings (session_id, seq)",
    "CREATE TABLE dead_letters (topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, "
    "service TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT NOT NULL, source_topic TEXT, source_partition INTEGER, "
    "source_offset INTEGER, session_id TEXT, seq INTEGER, at INTEGER NOT NULL, size INTEGER NOT NULL, "
    "head BLOB NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))",
    "CREATE INDEX dead_letters_by_session ON dead_letters (session_id)",
    "CREATE TABLE outcome_offsets (topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL, "
    "PRIMARY KEY (topic, partition))",
    # the records dead-letters --redrive sent back, by where they were first read
    "CREATE TABLE redriven (topic TEXT NOT NULL, partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, "
    "at INTEGER NOT NULL, PRIMARY KEY (topic, partition, \"offset\"))",
)
#: Each session's verdict counts as the auditor last published them (where they were read).
VERDICTS = ("CREATE TABLE audit_verdicts (session_id TEXT PRIMARY KEY, counts TEXT NOT NULL, topic TEXT NOT NULL, "
            "partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, at INTEGER NOT NULL)")
#: Each events partition's owner epoch: raised by every assignment (:meth:`ViewStore.claim`).
OWNERS = "CREATE TABLE partition_owners (partition INTEGER PRIMARY KEY, epoch INTEGER NOT NULL)"
#: A surface row's searchable text: its message's texts, lower-cased (:func:`message_texts`).
SURFACE_TEXT = "text TEXT NOT NULL DEFAULT ''"
#: The tables holding rows of a session (what deleting a session removes).
SESSION_TABLES = ("sessions", "usage", "surface", "held", "applied", "unacknowledged_heads", "findings", "dead_letters",
                  "audit_verdicts", "steps", "gateway_requests")
#: Layout 8: event times, ingestion time, steps and tokens (:mod:`.store_migrations`).
EVENT_TIMES = (
    "ALTER TABLE surface ADD COLUMN event_time INTEGER",
    "ALTER TABLE sessions ADD COLUMN ingested_at INTEGER",
    "ALTER TABLE sessions ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX sessions_by_tokens ON sessions (tokens, session_id)",
    "CREATE INDEX sessions_by_creation ON sessions (COALESCE(created_at, 0), session_id)",
    "CREATE TABLE steps (session_id TEXT NOT NULL, turn INTEGER NOT NULL, step INTEGER NOT NULL, "
    "started_at INTEGER, output_at INTEGER, ended_at INTEGER, provider TEXT, model TEXT, "
    + ", ".join(f"{column} INTEGER NOT NULL DEFAULT 0" for column in STEP_COLUMNS[7:])
    + ", PRIMARY KEY (session_id, turn, step))",
)
#: Layout 9: the requests gateways attested, by session (:mod:`.gateway_requests`).
GATEWAY_REQUESTS = (
    "CREATE TABLE gateway_requests (session_id TEXT NOT NULL, gateway TEXT NOT NULL, arrival INTEGER NOT NULL, "
    "kind TEXT NOT NULL, status INTEGER, outcome TEXT NOT NULL, received_at INTEGER, first_byte_ms INTEGER, "
    "duration_ms INTEGER, PRIMARY KEY (session_id, gateway, arrival))",
    "CREATE INDEX gateway_requests_by_time ON gateway_requests (session_id, received_at)",
)
SCHEMA = (
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, next_seq INTEGER NOT NULL, "
    "view TEXT NOT NULL, snapshot BLOB, error TEXT, " + ", ".join(SESSION_COLUMNS) + ")",
    "CREATE TABLE surface (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL, "
    f"{SURFACE_TEXT}, PRIMARY KEY (session_id, seq))",
    *EVENT_TIMES,
    *GATEWAY_REQUESTS,
    HELD_SCHEMA,
    DIGESTS_SCHEMA,
    "CREATE TABLE unacknowledged_heads (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL)",
    *LISTING,
    OWNERS,
    VERDICTS,
    LETTERS_BY_SOURCE,
    DELETED,
)


def message_texts(message: Any) -> list[str]:
    """What a text search finds in a derived message (or a surface event's
    data holding one): its text and reasoning, tool call arguments, the
    text inside tool results; not its ids, roles or JSON."""
    if isinstance(message, dict) and isinstance(message.get("message"), dict):
        message = message["message"]
    texts = []
    for block in message.get("content", ()) if isinstance(message, dict) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("text", "reasoning") and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool-call":
            texts.append(str(block.get("arguments")))
        elif kind == "tool-result":
            texts += [inner["text"] for inner in block.get("content", ())
                      if isinstance(inner, dict) and isinstance(inner.get("text"), str)]
    return texts


def searchable(data: Any) -> str:
    """A surface row's ``text`` column."""
    return "\n".join(message_texts(data)).lower()


def listing(view: dict[str, Any], last_activity: int | None) -> tuple:
    """``cwd, created_at, last_activity, turn_count, message_count`` of a
    view (no activity known: its creation)."""
    header = view.get("header") or {}
    return (header.get("cwd"), header.get("createdAt"),
            last_activity if last_activity is not None else header.get("createdAt"), len(view.get("turns") or ()),
            view.get("messageCount", 0))


def store_usage(db: Any, sessions: Iterable[tuple[str, Iterable[dict[str, Any]]]]) -> None:
    """Replace sessions' usage rows (``(session_id, view's usage)`` pairs)."""
    sessions = list(sessions)
    db.executemany("DELETE FROM usage WHERE session_id = ?", [(session_id,) for session_id, _ in sessions])
    db.executemany(f"INSERT INTO usage (session_id, provider, model, {', '.join(TOKEN_COLUMNS)}) "
                   f"VALUES (?, ?, ?, {', '.join('?' * len(TOKEN_COLUMNS))})",
                   [(session_id, row["provider"], row["model"], *(row.get(kind, 0) for kind in TOKEN_COLUMNS))
                    for session_id, usage in sessions for row in usage])


def store_steps(db: Any, rows: list[tuple[str, StepRow]]) -> None:
    """Replace these step rows (``(session_id, row)`` pairs)."""
    db.executemany(f"INSERT INTO steps (session_id, {', '.join(STEP_COLUMNS)}) "
                   f"VALUES (?, {', '.join('?' * len(STEP_COLUMNS))}) ON CONFLICT (session_id, turn, step) DO UPDATE "
                   "SET " + ", ".join(f"{column} = excluded.{column}" for column in STEP_COLUMNS[2:]),
                   [(session_id, *row) for session_id, row in rows])


def session_tokens(view: dict[str, Any]) -> int:
    """Every token of every kind a view's usage counts."""
    return sum(count for row in view.get("usage") or () for kind in TOKEN_COLUMNS
               if type(count := row.get(kind, 0)) is int and count > 0)
