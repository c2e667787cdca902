"""The view store's one interface on both backends: every test runs on the
SQLite file and on a real PostgreSQL database (a fresh one per test)."""

from __future__ import annotations

import json
import multiprocessing
import random
import urllib.parse

import msgspec
import psycopg
import pytest

from consumers.projector import Projection, ProjectorConfig, ViewStore
from consumers.projector.reader import SessionFilter
from consumers.projector.store import LAYOUT, TOKEN_COLUMNS, SessionChange, view_head
from consumers.projector.store_reader import StoreReader
from consumers.runtime.database import Database, store_digests
from consumers.runtime.postgres import PostgresDatabase
from consumers.runtime.store_location import store_backend
from dsh_core.analysis import LogAnalysis
from dsh_core.errors import FencedError, StateStoreError
from dsh_core.fold_snapshot import snapshot_fold
from dsh_pipeline.local_postgres import create_database
from dsh_core.jsonvalue import dump_json, encode_json, thaw
from dsh_kafka.records import KIND_HEADER, KIND_RECORD
from producers.simulator import SimulatorConfig, messages_digest, simulate_session
from tests import postgres_fixture
from tests.policy_driver import KAFKA, NAMES, fetched, run_batch
from tests.unit.dsh_core.test_fold_snapshot_72cba14 import old_snapshot, surface_rows
from tests.view_store_helpers import simulated_fleet, stored_fleet
from tests.writers import second_writer

postgres_dsn, store_location = postgres_fixture.postgres_dsn, postgres_fixture.store_location


def _project(location, records, **settings) -> None:
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=location, **settings)), fetched(records))


def _columns(store: ViewStore, session_id: str) -> tuple:
    return tuple(store.db.execute("SELECT status, next_seq, turn_count, message_count, cwd, created_at, "
                                  "last_activity FROM sessions WHERE session_id = ?", (session_id,)).fetchone())


def test_views_and_their_listing_equal_ground_truth(store_location):
    fleet = simulated_fleet(5, seed=71)
    _project(store_location, [record for _, records in fleet for record in records])
    store = ViewStore(store_location)
    try:
        for truth, records in fleet:
            view = store.view(truth.session_id)
            assert (view["status"], view["nextSeq"], view["messagesDigest"]) == (
                "idle", truth.next_seq, truth.messages_digest)
            messages = thaw(store.fold(truth.session_id).state.messages())
            assert messages_digest(messages) == truth.messages_digest
            status, next_seq, turns, message_count, cwd, created_at, _ = _columns(store, truth.session_id)
            header = view["header"]
            assert (status, next_seq, turns, message_count, cwd, created_at) == (
                "idle", truth.next_seq, truth.turns, len(messages), header.get("cwd"), header["createdAt"])
            usage = store.db.execute("SELECT provider, model, inputTokens, outputTokens FROM usage "
                                     "WHERE session_id = ? ORDER BY provider, model", (truth.session_id,)).fetchall()
            assert [tuple(row) for row in usage] == sorted(
                (u["provider"], u["model"], u.get("inputTokens", 0), u.get("outputTokens", 0)) for u in view["usage"])
    finally:
        store.close()


def test_held_records_survive_a_reopen_and_the_session_heals(store_location):
    [(truth, records)] = simulated_fleet(1, seed=72)
    late = next(index for index, record in enumerate(records) if record.kind == KIND_RECORD and record.seq > 4)
    _project(store_location, records[:late] + records[late + 1:])
    store = ViewStore(store_location)
    try:
        status, _, _, held = store.load(truth.session_id)
        assert status == "held" and [seq for seq, _, _ in held] == sorted(
            r.seq for r in records[late + 1:] if r.kind == KIND_RECORD)
        assert store.digest(truth.session_id, records[1].seq) is not None
    finally:
        store.close()
    _project(store_location, [records[late]])
    store = ViewStore(store_location)
    try:
        view = store.view(truth.session_id)
        assert (view["status"], view["nextSeq"], store.load(truth.session_id)[3]) == ("idle", truth.next_seq, [])
    finally:
        store.close()


def test_a_conflicted_session_stays_conflicted_and_its_first_writer_keeps_flowing(store_location):
    [(truth, records)], [(_, other)] = simulated_fleet(1, seed=74), simulated_fleet(1, seed=75)
    second = [r for r in second_writer(records, other) if r.kind in (KIND_HEADER, KIND_RECORD)]
    cut = len(records) // 2
    assert len(second) > cut + 3  # its seqs overlap the first writer's and go past them
    _project(store_location, records[:cut] + second)
    _project(store_location, records[cut:] + second[-1:])  # reopened: the second writer is still kept out
    store = ViewStore(store_location)
    try:
        view = store.view(truth.session_id)
        assert (view["status"], view["conflicted"], view["nextSeq"], view["messagesDigest"]) == (
            "conflicted", True, truth.next_seq, truth.messages_digest)
    finally:
        store.close()
    reader = StoreReader(store_location)
    try:
        listed = reader.sessions(SessionFilter(status=("conflicted",)))["items"]
        assert [item["sessionId"] for item in listed] == [truth.session_id]
        assert reader.session(truth.session_id)["status"] == "conflicted"
    finally:
        reader.close()


def test_a_head_stays_unacknowledged_until_acknowledged(store_location):
    view = {"sessionId": "s-1", "status": "open", "header": None, "nextSeq": 3, "turns": [], "usage": []}
    store = ViewStore(store_location)
    try:
        store.write([SessionChange("s-1", 2, view, None, None, (), (), None, {}, 1700000000000)], store.claim([2]))
        assert store.unacknowledged([1]) == []
        assert store.unacknowledged([2]) == [("s-1", 2, view_head(view))]
        store.acknowledged(["s-1"])
        assert store.unacknowledged([0, 1, 2]) == []
    finally:
        store.close()


def test_a_member_whose_partition_was_claimed_again_writes_nothing(store_location):
    """A projector the group replaced while it stalled (its successor
    claimed the partition) is fenced: its batch is refused whole, and the
    successor's views stand."""
    def change(session_id: str, partition: int, next_seq: int) -> SessionChange:
        view = {"sessionId": session_id, "status": "open", "header": None, "nextSeq": next_seq, "turns": [],
                "usage": []}
        return SessionChange(session_id, partition, view, None, None, (), (), None, {})

    stalled, successor = ViewStore(store_location), ViewStore(store_location)
    try:
        old = stalled.claim([0, 1])
        stalled.write([change("s-0", 0, 2), change("s-1", 1, 2)], old)
        new = successor.claim([0])
        assert new == {0: old[0] + 1}
        successor.write([change("s-0", 0, 5)], new)
        with pytest.raises(FencedError, match=r"events partition 0 was taken over by a newer member \(store epoch "
                                              rf"{old[0] + 1}, this member's {old[0]}\)"):
            stalled.write([change("s-1", 1, 3), change("s-0", 0, 3)], old)
        assert (successor.view("s-0")["nextSeq"], successor.view("s-1")["nextSeq"]) == (5, 2)  # nothing of it landed
        stalled.write([change("s-1", 1, 3)], old)  # a partition nobody took over stays its own
        assert successor.view("s-1")["nextSeq"] == 3
    finally:
        stalled.close()
        successor.close()


_LAYOUT_2 = (
    "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, status TEXT NOT NULL, next_seq INTEGER NOT NULL, "
    "view TEXT NOT NULL, snapshot BLOB, error TEXT)",
    "CREATE TABLE surface (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL, "
    "PRIMARY KEY (session_id, seq))",
    "CREATE TABLE unacknowledged_heads (session_id TEXT PRIMARY KEY, partition INTEGER NOT NULL)",
)


def _open(location, kind: str, layout: int, schema):
    return (PostgresDatabase(location, kind, layout, schema) if store_backend(location) == "postgresql"
            else Database(location, kind, layout, schema))


def test_a_layout_2_store_is_migrated_on_start(store_location):
    old = _open(store_location, "view-store", 2, _LAYOUT_2)
    view = {"sessionId": "s-old", "status": "idle", "header": {"id": "s-old", "createdAt": 1700000000000, "cwd": "/w"},
            "nextSeq": 9, "turns": [{"turn": 1}, {"turn": 2}], "messageCount": 4,
            "usage": [{"provider": "deepseek", "model": "m", "inputTokens": 10, "outputTokens": 3}]}
    with old.transaction() as db:
        db.execute("INSERT INTO sessions (session_id, status, next_seq, view) VALUES (?, ?, ?, ?)",
                   ("s-old", "idle", 9, dump_json(view).decode()))
    old.close()
    store = ViewStore(store_location)
    try:
        assert _columns(store, "s-old") == ("idle", 9, 2, 4, "/w", 1700000000000, 1700000000000)
        assert [tuple(r) for r in store.db.execute("SELECT provider, model, inputTokens FROM usage")] == [
            ("deepseek", "m", 10)]
        assert store.db.execute("SELECT version FROM dsh_layout").fetchone()[0] == LAYOUT
        assert store.claim([0]) == {0: 1}  # the owners table, added by the step from 3
        assert store.db.execute("SELECT count(*) FROM audit_verdicts").fetchone()[0] == 0  # added by the step from 4
    finally:
        store.close()


def test_a_store_of_another_kind_is_refused_naming_both(store_location):
    _open(store_location, "auditor-state", 4, ["CREATE TABLE t (x INTEGER)"]).close()
    with pytest.raises(StateStoreError, match=r"a 'auditor-state' store in layout 4, not the 'view-store' store in "
                                              rf"layout {LAYOUT} this service writes"):
        ViewStore(store_location)


def _project_in_process(location, seed: int) -> None:
    for truth, records in simulated_fleet(3, seed):
        random.Random(seed).shuffle(records)
        _project(location, records)


def test_two_processes_write_one_store_at_once(store_location):
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_project_in_process, args=(store_location, seed)) for seed in (73, 74)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0, 0]
    store = ViewStore(store_location)
    try:
        for truth, _ in simulated_fleet(3, 73) + simulated_fleet(3, 74):
            view = store.view(truth.session_id)
            assert (view["status"], view["nextSeq"], view["messagesDigest"]) == (
                "idle", truth.next_seq, truth.messages_digest)
    finally:
        store.close()


def test_the_reader_lists_filters_and_pages_thesimulated_fleet(store_location):
    fleet = stored_fleet(store_location)
    ids = [truth.session_id for truth, _ in fleet]
    reader = StoreReader(store_location)
    try:
        seen, cursor = [], None
        while True:
            page = reader.sessions(SessionFilter(), cursor, limit=4)
            seen += [item["sessionId"] for item in page["items"]]
            if (cursor := page["next"]) is None:
                break
        every = reader.sessions(SessionFilter(), limit=200)["items"]
        by = {order: [i["sessionId"] for i in sorted(every, key=lambda i: (i[field] or 0, i["sessionId"]),
                                                      reverse=True)]
              for order, field in (("activity", "lastActivity"), ("created", "createdAt"), ("tokens", "tokens"))}
        assert seen == by["activity"] and sorted(seen) == sorted(ids)  # most recently active first, each once
        for order in ("created", "tokens"):  # each order pages by its own key
            seen, cursor = [], None
            while True:
                page = reader.sessions(SessionFilter(), cursor, limit=4, order=order)
                seen += [item["sessionId"] for item in page["items"]]
                if (cursor := page["next"]) is None:
                    break
            assert seen == by[order]
        assert [i["sessionId"] for i in reader.sessions(SessionFilter(status=("held",)))["items"]] == [ids[-1]]
        assert [i["sessionId"] for i in reader.sessions(SessionFilter(has_findings=True))["items"]] == [ids[1]]
        assert len(reader.sessions(SessionFilter(has_findings=False))["items"]) == len(ids) - 1
        times = sorted(i["lastActivity"] for i in every)  # the logs' own times, not the records' (1 s to 6 s)
        assert [i["sessionId"] for i in reader.sessions(SessionFilter(active_from=times[1], active_to=times[3]))[
            "items"]] == by["activity"][-3:-1]
        one = reader.session(ids[1])
        store = ViewStore(store_location)
        try:
            assert one["messages"] == thaw(store.fold(ids[1]).state.messages())
        finally:
            store.close()
        assert one["findingCount"] == 1 and one["findings"][0]["rule"] == "request-mismatch"
        model = one["models"][0]["model"]
        assert ids[1] in [i["sessionId"] for i in reader.sessions(SessionFilter(model=model), limit=50)["items"]]
        text = next(m["content"][0]["text"] for m in one["messages"] if m["role"] == "user")
        found = reader.sessions(SessionFilter(text=text[:24].upper()))["items"]
        assert ids[1] in [i["sessionId"] for i in found]
        assert reader.sessions(SessionFilter(text="no such text 100%"))["items"] == []
        assert reader.resolve(ids[1][:-3]) == [ids[1]] and reader.resolve("nothing-") == []
        summary = reader.summary()
        assert summary["sessionsByStatus"] == {"held": 1, "idle": len(ids) - 1}
        hours = summary["tokensByModelPerHour"]
        assert hours and all(isinstance(row[column], int) for row in hours for column in TOKEN_COLUMNS)
        listed = reader.sessions(SessionFilter(), limit=200)["items"]
        assert {column: sum(row[column] for row in hours) for column in TOKEN_COLUMNS} == \
            {column: sum(model.get(column) or 0 for item in listed for model in item["models"])
             for column in TOKEN_COLUMNS}
        with pytest.raises(ValueError, match="cursor 'bogus' is not one this store gave"):
            reader.sessions(SessionFilter(), "bogus")
        import base64
        huge = base64.urlsafe_b64encode(f"{2 ** 70}\x1fsim".encode()).decode()
        with pytest.raises(ValueError, match="is not one this store gave"):
            reader.sessions(SessionFilter(), huge)
    finally:
        reader.close()


def test_a_session_read_page_by_page_is_the_whole_session(store_location):
    fleet = stored_fleet(store_location)
    reader = StoreReader(store_location)
    try:
        for truth, _ in fleet:
            whole, pages, after = reader.session(truth.session_id), [], None
            while True:
                pages.append(reader.session_page(truth.session_id, after, 2))
                if (after := pages[-1]["next"]) is None:
                    break
                after = int(after)
            assert len(pages) == max(1, -(-len(whole["surface"]) // 2))
            assert [event for page in pages for event in page["surface"]] == whole["surface"]
            assert _in_order([m for page in pages for m in page["messages"]]) == _in_order(whole["messages"])
            assert {k: v for page in pages for k, v in page["messageSeqs"].items()} == whole["messageSeqs"]
            assert [f for page in pages for f in page["findings"]] == whole["findings"]
            assert [c for page in pages for c in page["requestHeaderChanges"]] == whole["requestHeaderChanges"]
            assert [t for page in pages for t in page["turns"]] == whole["turns"]
            assert {page["turnCount"] for page in pages} == {len(whole["turns"])}
            for page in pages:  # the totals are the session's, on every page
                assert (page["messageCount"], page["surfaceCount"], page["findingCount"]) == \
                    (len(whole["messages"]), len(whole["surface"]), whole["findingCount"])
                assert [(m["model"], m["inputTokens"], m["outputTokens"]) for m in page["models"]] == \
                    [(m["model"], m["inputTokens"], m["outputTokens"]) for m in whole["models"]]
            if whole["surface"]:
                event = whole["surface"][-1]
                assert reader.surface_event(truth.session_id, event["seq"]) == event
        assert reader.surface_event(fleet[0][0].session_id, 10 ** 9) is None
        assert reader.session_page("no-such-session") is None
    finally:
        reader.close()


def _in_order(messages: list) -> list:
    """Messages by their JSON (a page gives them in seq order, dsh's history after a compaction not)."""
    return sorted(messages, key=lambda message: json.dumps(message, sort_keys=True))


def test_a_reader_never_creates_a_store(tmp_path):
    with pytest.raises(StateStoreError, match=r"missing.sqlite: no view store there"):
        StoreReader(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()


def test_text_holding_nul_is_stored_and_found(store_location):
    """PostgreSQL's text holds no NUL; a log's text may ("\\u0000" in JSON)."""
    view = {"sessionId": "s\x00nul", "status": "idle", "header": {"id": "s\x00nul", "createdAt": 5, "cwd": "/w\x00"},
            "nextSeq": 2, "turns": [], "usage": [], "messageCount": 1}
    message = {"id": "u-1", "role": "user", "content": [{"type": "text", "text": "find a\x00b here"}],
               "source": {"kind": "user"}}
    store = ViewStore(store_location)
    try:
        store.write([SessionChange("s\x00nul", 0, view, None, "an error\x00", (), [(1, "user/message", message)],
                                   None, {1: (1, b"d" * 32)}, 7)], store.claim([0]))
        assert store.view("s\x00nul")["header"]["cwd"] == "/w\x00"  # the view's JSON keeps it exactly
        assert store.digest("s\x00nul", 1) == (1, b"d" * 32)
    finally:
        store.close()
    reader = StoreReader(store_location)
    try:
        [found] = reader.sessions(SessionFilter(text="A\x00B"))["items"]
        assert reader.session(found["sessionId"])["surface"][0]["data"] == message
    finally:
        reader.close()


def test_a_batch_of_many_rows_upserts_and_a_rolled_back_one_leaves_nothing(store_location):
    """Hundreds of rows in one statement (PostgreSQL copies them in through
    a staging table): conflicts update, NUL text survives, and a batch that
    fails leaves neither its rows nor a stale staging table behind."""
    store = ViewStore(store_location)
    try:
        def rows(count: int, marker: bytes) -> dict[int, tuple[int, bytes]]:
            return {seq: (seq % 3 + 1, marker * 32) for seq in range(1, count + 1)}

        with pytest.raises(RuntimeError, match="the batch failed"):
            with store.database.transaction() as db:
                store_digests(db, [("s\x00many", rows(300, b"a"))])
                raise RuntimeError("the batch failed")
        assert store.digest("s\x00many", 1) is None
        for marker in (b"b", b"c"):  # the second batch updates every row of the first
            with store.database.transaction() as db:
                store_digests(db, [("s\x00many", rows(300, marker)), ("other", rows(100, marker))])
        for session, count in (("s\x00many", 300), ("other", 100)):
            assert {seq: store.digest(session, seq) for seq in range(1, count + 2)} == {
                **rows(count, b"c"), count + 1: None}
        assert store.db.execute("SELECT count(*) FROM applied").fetchone()[0] == 400
    finally:
        store.close()


def test_a_deleted_session_is_never_written_again(store_location):
    """delete-session under a running projector: the projector's next batch,
    made from what it still held, writes nothing of the session; its
    outcomes indexed later are dropped, but its deleted-session letters."""
    def change(session_id: str, seq: int) -> SessionChange:
        view = {"sessionId": session_id, "status": "open", "header": None, "nextSeq": seq + 1, "turns": [],
                "usage": []}
        return SessionChange(session_id, 0, view, None, None, (), [(seq, "user/message", {"n": seq})], None, {})

    running, command = ViewStore(store_location), ViewStore(store_location)
    try:
        epochs = running.claim([0])
        running.write([change("s-gone", 1), change("s-kept", 1)], epochs)
        command.delete_session("s-gone", 1700000000000)
        assert running.write([change("s-gone", 3), change("s-kept", 3)], epochs) == {"s-gone"}
        letter = ("dsh.dead-letter", 0, 1, "projector", "invalid-log", "d", "dsh.session-events", 0, 7, "s-gone", 1,
                  5, 1, b"x")
        fenced = letter[:2] + (2,) + letter[3:4] + ("deleted-session",) + letter[5:]
        running.index_outcomes([("dsh.findings", 0, 1, "s-gone", "rule", "error", 1, None, None, "d", 5)],
                               [letter, fenced], [("s-gone", "{}", "dsh.audit-verdicts", 0, 1, 5)], {})
        assert running.view("s-gone") is None and running.surface_events("s-gone") == []
        assert running.deleted(["s-gone", "s-kept"]) == {"s-gone"} and running.view("s-kept")["nextSeq"] == 4
        assert [tuple(row) for row in running.db.execute("SELECT reason FROM dead_letters")] == [("deleted-session",)]
        assert [count for (count,) in running.db.execute(
            "SELECT (SELECT COUNT(*) FROM findings) + (SELECT COUNT(*) FROM audit_verdicts)")] == [0]
        running.write([], epochs, {"s-kept": (0, 1700000000001)})  # the fence read by the projector itself
        assert running.view("s-kept") is None and running.deleted(["s-kept"]) == {"s-kept"}
    finally:
        running.close()
        command.close()


def test_a_layout_5_store_notes_the_records_it_redrove(store_location):
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


def test_a_layout_6_store_saves_its_pickled_fold_snapshots_again_as_layout_3(store_location):
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


def _without_layout_8(db) -> None:
    """What layout 8 added to a store taken away."""
    for statement in ("DROP TABLE steps", "DROP INDEX sessions_by_tokens", "DROP INDEX sessions_by_creation",
                      "ALTER TABLE surface DROP COLUMN event_time", "ALTER TABLE sessions DROP COLUMN tokens",
                      "ALTER TABLE sessions DROP COLUMN ingested_at"):
        db.execute(statement)


def test_a_layout_7_store_keeps_its_times_as_ingestion_times_and_sums_its_tokens(store_location):
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


def _renamed(records, session_id: str):
    """A simulated session's records as those of ``session_id`` (untagged:
    the renamed header is not the one their writer was taken from)."""
    old, new = json.dumps(records[0].session_id).encode(), encode_json(session_id)
    return [msgspec.structs.replace(record, session_id=session_id, value=record.value.replace(old, new), writer="")
            for record in records]


@pytest.mark.parametrize("batches", [1, 2])
def test_two_session_ids_told_apart_only_by_nul_never_share_a_row(store_location, batches):
    """PostgreSQL's text holds no NUL: ``s<NUL>`` and ``s\\u0000`` (six
    characters) are two sessions. The one whose key holds NUL is no session
    id (every service refuses it, by one name); the other is projected
    alone, in one batch or two; and the store, given both, keeps both."""
    [(truth, records)] = simulated_fleet(1, seed=76)
    spelled, nul = truth.session_id + "\\u0000", truth.session_id + "\x00"
    both = [_renamed(records, spelled), _renamed(records, nul)]
    outputs = []
    for batch in ([both[0] + both[1]] if batches == 1 else both):
        outputs.append(run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=store_location)), fetched(batch)))
    letters = [letter for out in outputs for letter in out.on(NAMES.dead_letter)]
    assert {(key, headers["dsh-dlq-reason"]) for key, _, headers in letters} == {
        (nul.encode(), b"invalid-session-id")}
    assert len(letters) == len(records)
    store = ViewStore(store_location)
    try:
        view = store.view(spelled)
        assert (view["sessionId"], view["status"], view["nextSeq"], view["messagesDigest"]) == (
            spelled, "idle", truth.next_seq, truth.messages_digest)
        assert store.stored([spelled, nul]) == {spelled}
        views = {session_id: {"sessionId": session_id, "status": "open", "header": None, "nextSeq": n, "turns": [],
                              "usage": []} for n, session_id in enumerate(("s\x00", "s\\u0000"), 1)}
        changes = [SessionChange(session_id, 0, view, None, None, (), (), None, {}) for session_id, view in
                   views.items()]
        for written in ([changes] if batches == 1 else [[change] for change in changes]):
            store.write(written, store.claim([0]))
        assert {session_id: store.view(session_id) for session_id in views} == views
    finally:
        store.close()


def _with_text(records, text: str):
    """The records with ``text`` put before the text of every user message."""
    escaped = encode_json(text)[1:-1]
    return [msgspec.structs.replace(record, value=record.value.replace(b'"type":"text","text":"',
                                                                       b'"type":"text","text":"' + escaped))
            if b'"type":"user/message"' in record.value else record for record in records]


@pytest.mark.parametrize("version", [0, 4])
def test_text_no_store_text_holds_is_kept_exactly_and_found(store_location, version):
    """A lone surrogate, NUL and the store's own escape character in message
    text: the session is projected, its surface rows read back exactly and
    a search for the text finds it, on both backends alike."""
    text = "\ud800 nul\x00 \udfff\U0010ffff0; "
    config = SimulatorConfig(sessions=1, seed=77, min_turns=1, max_turns=2, formats=(version,))
    truth, batches = simulate_session(config, 0)
    _project(store_location, _with_text([record for batch in batches for record in batch], text))
    reader = StoreReader(store_location)
    try:
        session = reader.session(truth.session_id)
        assert (session["status"], session["nextSeq"]) == ("idle", truth.next_seq)
        texts = [block["text"] for message in session["messages"] if message["role"] == "user"
                 for block in message["content"] if block["type"] == "text"]
        assert texts and all(value.startswith(text) for value in texts)
        assert [item["sessionId"] for item in reader.sessions(SessionFilter(text=text.upper()))["items"]] == [
            truth.session_id]
        assert reader.sessions(SessionFilter(text="\ud800 nul\x00 \udffe"))["items"] == []
    finally:
        reader.close()


def test_rows_a_store_refuses_for_their_content_refuse_their_session_alone(store_location):
    """Token counts past the store's 64-bit columns: that session's records
    of the batch are dead-lettered (unstorable) and the session is refused;
    the batch's other sessions are stored, and the projector goes on."""
    (truth, records), (other, others) = simulated_fleet(2, seed=79)
    huge = [msgspec.structs.replace(record, value=record.value.replace(b'"inputTokens":', b'"inputTokens":9' + b"0" * 25))
            for record in records]
    outputs = run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=store_location)), fetched(huge + others))
    letters = outputs.on(NAMES.dead_letter)
    assert {(key, headers["dsh-dlq-reason"]) for key, _, headers in letters} == {
        (truth.session_id.encode(), b"unstorable")}
    assert len(letters) == sum(1 for record in records if record.kind in (KIND_HEADER, KIND_RECORD))  # all it took
    assert b"the view store refused the rows of session(s) " in letters[0][2]["dsh-dlq-error"]
    store = ViewStore(store_location)
    try:
        refused = store.view(truth.session_id)
        assert (refused["status"], refused["usage"]) == ("refused", [])
        assert refused["error"].startswith("[unstorable] UnstorableError: ")
        assert (store.view(other.session_id)["status"], store.view(other.session_id)["nextSeq"]) == (
            "idle", other.next_seq)
    finally:
        store.close()


def _database(postgres_dsn, options: str) -> str:
    """A fresh database created with ``options``."""
    location = create_database(postgres_dsn, "test")
    name = urllib.parse.urlsplit(location).path.lstrip("/")  # (the DSN's query names its password file)
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE {name}")
        connection.execute(f"CREATE DATABASE {name} TEMPLATE template0 {options}")
    return location


def test_sessions_are_listed_in_one_order_on_both_backends_whatever_the_collation(tmp_path, postgres_dsn):
    """Text compares by code point on both backends: a PostgreSQL database
    whose default collation is a language's lists like the SQLite file."""
    locations = [tmp_path / "views.sqlite", _database(postgres_dsn, "LOCALE_PROVIDER icu ICU_LOCALE 'und'")]
    orders = []
    for location in locations:
        store = ViewStore(location)
        try:
            store.write([SessionChange(session_id, 0, {"sessionId": session_id, "status": "open", "header": None,
                                                       "nextSeq": 1, "turns": [], "usage": []}, None, None, (), (),
                                       None, {}, 5) for session_id in ("a-1", "B-1", "é-1", "b-1")], store.claim([0]))
        finally:
            store.close()
        reader = StoreReader(location)
        try:
            orders.append([item["sessionId"] for item in reader.sessions(SessionFilter())["items"]])
        finally:
            reader.close()
    assert orders == [["é-1", "b-1", "a-1", "B-1"]] * 2


def test_a_database_whose_text_cannot_hold_every_character_is_refused(postgres_dsn):
    location = _database(postgres_dsn, "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'")
    with pytest.raises(StateStoreError, match=r"the database's encoding is SQL_ASCII, whose text cannot hold every "
                                              r"character a log may: the view-store needs a UTF8 database"):
        ViewStore(location)
