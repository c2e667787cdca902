"""The view store's contract, its layouts: an older layout is migrated on
start, another kind of store refused (a part of
:class:`tests.view_store_contract.ViewStoreContract`)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from consumers.projector import Projection, ProjectorConfig
from consumers.projector.reader import SessionFilter
from consumers.projector.store import LAYOUT, TOKEN_COLUMNS, SessionChange, ViewStore
from consumers.projector.store_reader import StoreReader
from consumers.runtime.store_backends import Backend
from dsh_core.analysis import LogAnalysis
from consumers.runtime.errors import StateStoreError
from dsh_core.fold_snapshot import snapshot_fold
from dsh_core.jsonvalue import dump_json
from tests.unit.dsh_core.test_fold_snapshot_72cba14 import old_snapshot, surface_rows
from tests.policy_driver import KAFKA, fetched, run_batch
from tests.view_store_helpers import listing_columns, simulated_fleet

_LAYOUT_2 = (
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, next_seq INTEGER NOT NULL, "
    "view TEXT NOT NULL, snapshot BLOB, error TEXT)",
    "CREATE TABLE surface (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL, "
    "PRIMARY KEY (session_id, seq))",
    "CREATE TABLE unacknowledged_heads (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL)",
)


def _without_layout_8(db) -> None:
    """What layouts 8 and 9 added to a store taken away."""
    for statement in ("DROP TABLE gateway_requests", "DROP TABLE steps", "DROP INDEX sessions_by_tokens", "DROP INDEX sessions_by_creation",
                      "ALTER TABLE surface DROP COLUMN event_time", "ALTER TABLE sessions DROP COLUMN tokens",
                      "ALTER TABLE sessions DROP COLUMN ingested_at"):
        db.execute(statement)


class LayoutsContract:
    """The layout tests of the contract."""

    backend: ClassVar[Backend]

    def test_a_layout_2_store_is_migrated_on_start(self, store_location):
        old = self.backend.open(store_location, "view-store", 2, _LAYOUT_2, {})
        view = {"sessionId": "s-old", "status": "idle", "header": {"id": "s-old", "createdAt": 1700000000000, "cwd": "/w"},
                "nextSeq": 9, "turns": [{"turn": 1}, {"turn": 2}], "messageCount": 4,
                "usage": [{"provider": "deepseek", "model": "m", "inputTokens": 10, "outputTokens": 3}]}
        with old.transaction() as db:
            db.execute("INSERT INTO sessions (session_id, status, next_seq, view) VALUES (?, ?, ?, ?)",
                       ("s-old", "idle", 9, dump_json(view).decode()))
        old.close()
        store = ViewStore(store_location)
        try:
            assert listing_columns(store, "s-old") == ("idle", 9, 2, 4, "/w", 1700000000000, 1700000000000)
            assert [tuple(r) for r in store.db.execute("SELECT provider, model, inputTokens FROM usage")] == [
                ("deepseek", "m", 10)]
            assert store.db.execute("SELECT version FROM dsh_layout").fetchone()[0] == LAYOUT
            assert store.claim([0]) == {0: 1}  # the owners table, added by the step from 3
            assert store.db.execute("SELECT count(*) FROM audit_verdicts").fetchone()[0] == 0  # added by the step from 4
        finally:
            store.close()

    def test_a_store_of_another_kind_is_refused_naming_both(self, store_location):
        self.backend.open(store_location, "auditor-state", 4, ["CREATE TABLE t (x INTEGER)"], {}).close()
        with pytest.raises(StateStoreError, match=r"a 'auditor-state' store in layout 4, not the 'view-store' store in "
                                                  rf"layout {LAYOUT} this service writes"):
            ViewStore(store_location)

    def test_a_layout_5_store_notes_the_records_it_redrove(self, store_location):
        store = ViewStore(store_location)
        try:
            store.index_outcomes([], [("dsh.dead-letter", 0, 9, "projector", "invalid-log", "d", "dsh.session-events", 2,
                                       7, "s-1", 1, 5, 1, b"x")], [], {})
            store.mark_redriven([("dsh.dead-letter", 0, 9)], 1700000000000)
            with store.database.transaction() as db:  # the store as layout 5 left it: redriven names the letters
                db.execute("DROP TABLE deleted_sessions")
                db.execute("DROP INDEX dead_letters_by_source")
                _without_layout_8(db)
                db.execute("UPDATE dsh_layout SET version = 5")
        finally:
            store.close()
        store = ViewStore(store_location)
        try:
            assert store.redriven([("dsh.session-events", 2, 7), ("dsh.dead-letter", 0, 9)]) == {
                ("dsh.session-events", 2, 7)}
            assert store.deleted(["s-1"]) == set()
        finally:
            store.close()

    def test_a_layout_6_store_saves_its_pickled_fold_snapshots_again_as_layout_3(self, store_location):
        blob, _, _, never_stopped = old_snapshot("tools-v4-projector")
        view = {"sessionId": "s-1", "status": "open", "header": None, "nextSeq": never_stopped.count, "turns": [],
                "usage": []}
        store = ViewStore(store_location)
        try:
            store.write([SessionChange("s-1", 0, view, blob, None, (), surface_rows(never_stopped), None, {})],
                        store.claim([0]))
            with store.database.transaction() as db:  # the store as 72cba14 left it
                _without_layout_8(db)
                db.execute("UPDATE dsh_layout SET version = 6")
        finally:
            store.close()
        store = ViewStore(store_location)
        try:
            expected = snapshot_fold(never_stopped, with_surface_events=False)
            assert [bytes(snapshot) for (snapshot,) in store.db.execute("SELECT snapshot FROM sessions")] == [expected]
            assert snapshot_fold(store.fold("s-1", LogAnalysis(keep_requests=False)), with_surface_events=False) == expected
        finally:
            store.close()

    def test_a_layout_7_store_keeps_its_times_as_ingestion_times_and_sums_its_tokens(self, store_location):
        [(truth, records)] = simulated_fleet(1, seed=78)
        run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=store_location)), fetched(records))
        store = ViewStore(store_location)
        try:
            with store.database.transaction() as db:  # the store as layout 7 left it: the topic's time, no steps
                db.execute("UPDATE sessions SET last_activity = 1234")
                _without_layout_8(db)
                db.execute("UPDATE dsh_layout SET version = 7")
        finally:
            store.close()
        ViewStore(store_location).close()
        reader = StoreReader(store_location)
        try:
            [item] = reader.sessions(SessionFilter())["items"]
            assert (item["lastActivity"], item["ingestedAt"], item["lagMs"]) == (1234, 1234, 0)
            assert item["tokens"] == sum(row.get(kind, 0) for row in item["models"] for kind in TOKEN_COLUMNS) > 0
            page = reader.session_page(truth.session_id)
            assert page["steps"] == [] and {event["time"] for event in page["surface"]} == {None}
            assert [row["hour"] for row in reader.summary()["tokensByModelPerHour"]] == [0] * len(item["models"])
        finally:
            reader.close()

    def test_a_layout_8_store_gains_an_empty_table_of_gateway_requests(self, store_location):
        [(truth, records)] = simulated_fleet(1, seed=79)
        run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=store_location)), fetched(records))
        store = ViewStore(store_location)
        try:
            with store.database.transaction() as db:  # the store as layout 8 left it
                db.execute("DROP TABLE gateway_requests")
                db.execute("UPDATE dsh_layout SET version = 8")
        finally:
            store.close()
        store = ViewStore(store_location)
        try:
            assert store.db.execute("SELECT version FROM dsh_layout").fetchone()[0] == LAYOUT == 9
            assert store.db.execute("SELECT COUNT(*) FROM gateway_requests").fetchone()[0] == 0
        finally:
            store.close()
        reader = StoreReader(store_location)
        try:
            page = reader.session_page(truth.session_id)
            assert page["steps"] and all(step["gateway"] == [] for step in page["steps"])
        finally:
            reader.close()
