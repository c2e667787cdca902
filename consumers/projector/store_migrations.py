"""How a view store of an older layout becomes one of this build's
(:data:`MIGRATIONS`, run step by step inside the claiming transaction by
:func:`~consumers.runtime.database.claim_layout`; the table of steps is
in docs/reference/view-store.md). Each step is written in the dialect
both backends share, and reads the rows as the layout it starts from
left them.
"""

from __future__ import annotations

from typing import Any

from dsh_core.analysis import LogAnalysis
from dsh_core.fold_snapshot import is_pickled, restore_fold, snapshot_fold
from dsh_core.jsonvalue import decode_json

from ..runtime.database import Migrations
from .store_schema import (DELETED, EVENT_TIMES, GATEWAY_REQUESTS, LETTERS_BY_SOURCE, LISTING, OWNERS, SESSION_COLUMNS,
                           SURFACE_TEXT, TOKEN_COLUMNS, VERDICTS, listing, searchable, store_usage)

__all__ = ["MIGRATIONS"]


def _layout_2_to_3(db: Any) -> None:
    """Layout 2 had no listing columns, usage, findings, dead letters or
    searchable surface text: add them and fill them from each stored view
    and surface row."""
    db.execute(f"ALTER TABLE surface ADD COLUMN {SURFACE_TEXT}")
    for session_id, seq, data in db.execute("SELECT session_id, seq, data FROM surface").fetchall():
        db.execute("UPDATE surface SET text = ? WHERE session_id = ? AND seq = ?",
                   (searchable(decode_json(data)), session_id, seq))
    for column in SESSION_COLUMNS:
        db.execute(f"ALTER TABLE sessions ADD COLUMN {column}")
    for statement in LISTING:
        db.execute(statement)
    for session_id, view in db.execute("SELECT session_id, view FROM sessions").fetchall():
        view = decode_json(view)
        db.execute("UPDATE sessions SET cwd = ?, created_at = ?, last_activity = ?, turn_count = ?, "
                   "message_count = ? WHERE session_id = ?", (*listing(view, None), session_id))
        store_usage(db, [(session_id, view.get("usage") or ())])


def _layout_3_to_4(db: Any) -> None:
    """Layout 3 did not fence members: no partition has an owner yet."""
    db.execute(OWNERS)


def _layout_4_to_5(db: Any) -> None:
    """Layout 4 kept no verdict counts: the index reads them from the topic."""
    db.execute(VERDICTS)


def _layout_5_to_6(db: Any) -> None:
    """Layout 5 noted each dead letter sent back, not each record: note the
    records those letters came from; and it kept no deleted sessions."""
    db.execute(DELETED)
    db.execute(LETTERS_BY_SOURCE)
    records = db.execute(
        "SELECT d.source_topic, d.source_partition, d.source_offset, MIN(r.at) FROM redriven r JOIN dead_letters d "
        "ON d.topic = r.topic AND d.partition = r.partition AND d.\"offset\" = r.\"offset\" "
        "WHERE d.source_topic IS NOT NULL AND d.source_partition IS NOT NULL AND d.source_offset IS NOT NULL "
        "GROUP BY d.source_topic, d.source_partition, d.source_offset").fetchall()
    db.execute("DELETE FROM redriven")
    db.executemany("INSERT INTO redriven (topic, partition, \"offset\", at) VALUES (?, ?, ?, ?)", records)


def _layout_6_to_7(db: Any) -> None:
    """Layout 6 held v3/v4 fold snapshots pickled (naming the modules of
    their classes): each is restored once and saved again as fold snapshot
    layout 3, which names none."""
    for (session_id,) in db.execute("SELECT session_id FROM sessions WHERE snapshot IS NOT NULL").fetchall():
        blob = bytes(db.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session_id,)).fetchone()[0])
        if not is_pickled(blob):
            continue
        rows = [(seq, kind, decode_json(data)) for seq, kind, data in db.execute(
            "SELECT seq, type, data FROM surface WHERE session_id = ? ORDER BY seq", (session_id,))]
        fold = restore_fold(blob, f"session {session_id!r}", LogAnalysis(keep_requests=False), rows)
        db.execute("UPDATE sessions SET snapshot = ? WHERE session_id = ?",
                   (snapshot_fold(fold, with_surface_events=False), session_id))


def _layout_7_to_8(db: Any) -> None:
    """Layout 7 kept no event times: its sessions' last activity was the
    topic's time of their last record. That time becomes their
    ``ingested_at`` and stays their last activity until the session's next
    record (or a rebuild) gives its event time; their surface rows have no
    time and their steps no row until rebuilt. Their tokens are summed."""
    for statement in EVENT_TIMES:
        db.execute(statement)
    db.execute("UPDATE sessions SET ingested_at = last_activity")
    db.execute("UPDATE sessions SET tokens = COALESCE((SELECT SUM(" + " + ".join(TOKEN_COLUMNS)
               + ") FROM usage u WHERE u.session_id = sessions.session_id), 0)")


def _layout_8_to_9(db: Any) -> None:
    """Layout 8 kept no gateway requests: the attestations read before come
    with a rebuild (a new projector group)."""
    for statement in GATEWAY_REQUESTS:
        db.execute(statement)


#: Each step by the layout it starts from.
MIGRATIONS: Migrations = {2: _layout_2_to_3, 3: _layout_3_to_4, 4: _layout_4_to_5, 5: _layout_5_to_6,
                          6: _layout_6_to_7, 7: _layout_7_to_8, 8: _layout_8_to_9}
