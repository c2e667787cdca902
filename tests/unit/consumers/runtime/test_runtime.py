"""The shared consumer runtime without a broker: per-session ordering, the
session table, the services' SQLite files."""

from __future__ import annotations

import sqlite3

import pytest

from consumers.runtime.database import DIGESTS_SCHEMA, Database, applied_digest, store_digests
from consumers.runtime.sequencing import AppliedDigests, HeldRecords, Placement, deliver, drain
from consumers.runtime.sessions import SessionTable
from consumers.runtime.errors import StateStoreError
from dsh_core.errors import ConflictingWriterError, HeldLimitError


class _Log:
    """A session that takes records of ``count`` events; ``refuse_at`` stops it."""

    def __init__(self, started: bool = True, limit: int = 10, refuse_at: int | None = None) -> None:
        self.held = HeldRecords("s", limit=limit)
        self.digests = AppliedDigests("s")
        self.applied: list[bytes] = []
        self.seq: int | None = 0 if started else None
        self.refuse_at = refuse_at

    def next_seq(self) -> int | None:
        return self.seq

    def apply(self, value: bytes, count: int) -> bool:
        if self.seq == self.refuse_at:
            self.seq = None
            return False
        self.applied.append(value)
        self.seq += count
        return True


def test_records_apply_in_seq_order_whatever_order_they_arrive_in():
    log = _Log()
    assert deliver(log, 2, b"c", 1) is Placement.HELD
    assert deliver(log, 2, b"c", 1) is Placement.HELD_AGAIN
    assert deliver(log, 3, b"d", 2) is Placement.HELD
    assert deliver(log, 0, b"a", 1) is Placement.APPLIED
    assert log.applied == [b"a"] and len(log.held) == 2  # seq 1 still missing
    assert deliver(log, 1, b"b", 1) is Placement.APPLIED
    assert log.applied == [b"a", b"b", b"c", b"d"] and log.seq == 5 and not log.held
    assert deliver(log, 3, b"d", 2) is Placement.DUPLICATE
    assert log.applied == [b"a", b"b", b"c", b"d"]


def test_a_session_without_its_start_holds_everything_until_drained():
    log = _Log(started=False)
    assert deliver(log, 0, b"a", 1) is Placement.HELD
    assert deliver(log, 1, b"b", 1) is Placement.HELD
    log.seq = 0  # the header arrived
    assert drain(log) == 2 and log.applied == [b"a", b"b"]


def test_held_copies_below_the_next_seq_are_dropped_as_stale():
    log = _Log()
    deliver(log, 1, b"b", 1)
    log.seq = 2  # moved on another way (a packed record covering seq 1)
    assert drain(log) == 0 and not log.held and not log.held.dirty  # never stored: nothing to write


def test_a_store_writes_what_changed_in_the_held_records_only():
    held = HeldRecords("s", [(5, b"stored", 1), (6, b"stored too", 1)])
    assert not held.dirty and held.bytes == 16
    held.hold(8, b"new", 1, waiting_for=4)
    assert held.take(6) == (b"stored too", 1)  # drops 5 as stale as well
    assert held.dirty and held.changes() == ([5, 6], [(8, b"new", 1)])
    assert not held.dirty and held.changes() == ([], []) and held.bytes == 3


def test_draining_stops_at_a_refusal():
    log = _Log(refuse_at=1)
    deliver(log, 1, b"b", 1)
    deliver(log, 2, b"c", 1)
    deliver(log, 0, b"a", 1)
    assert log.applied == [b"a"] and list(log.held.records) == [2]


def test_the_held_limits_in_records_and_bytes_are_named_refusals():
    log = _Log(limit=2)
    deliver(log, 5, b"x", 1)
    deliver(log, 6, b"y", 1)
    with pytest.raises(HeldLimitError, match=r"session 's' waits for seq 0 and keeps at most 2 later records of "
                                             r"\d+ bytes in all; seq 7 is dead-lettered") as caught:
        deliver(log, 7, b"z", 1)
    assert caught.value.category == "held-limit" and len(log.held) == 2
    held = HeldRecords("s", byte_limit=10)
    held.hold(3, b"12345678", 1, waiting_for=0)
    with pytest.raises(HeldLimitError, match=r"of 10 bytes in all; seq 4 is dead-lettered"):
        held.hold(4, b"123", 1, waiting_for=0)


def test_a_copy_is_a_duplicate_only_with_the_bytes_applied_or_held_at_its_seq():
    log = _Log()
    deliver(log, 0, b"a", 1)
    deliver(log, 2, b"c", 1)
    assert deliver(log, 0, b"a", 1) is Placement.DUPLICATE
    with pytest.raises(ConflictingWriterError, match=r"session 's' seq 0: a record of sha256 [0-9a-f]{64}, where one "
                                                     r"of sha256 [0-9a-f]{64} came first; two writers share") as caught:
        deliver(log, 0, b"forged", 1)
    assert (caught.value.category, caught.value.seq) == ("conflicting-writer", 0)
    with pytest.raises(ConflictingWriterError, match="seq 2"):
        deliver(log, 2, b"forged", 1)  # held, not yet applied
    deliver(log, 1, b"b", 1)
    assert log.applied == [b"a", b"b", b"c"] and sorted(log.digests.new) == [0, 1, 2]


def test_applied_digests_are_asked_of_the_store_once_written():
    db = sqlite3.connect(":memory:")
    db.execute(DIGESTS_SCHEMA)
    log = _Log()
    deliver(log, 0, b"a", 1)
    store_digests(db, [("s", log.digests.changes())])
    assert not log.digests.dirty and applied_digest(db, "s", 1) is None
    log.digests = AppliedDigests("s", lambda seq: applied_digest(db, "s", seq))
    assert deliver(log, 0, b"a", 1) is Placement.DUPLICATE
    with pytest.raises(ConflictingWriterError):
        deliver(log, 0, b"b", 1)


def test_a_copy_without_a_known_digest_or_framed_otherwise_counts_as_a_duplicate():
    log = _Log()
    log.seq = 5  # applied before digests were kept (or before a crash lost them)
    assert deliver(log, 3, b"anything", 1) is Placement.DUPLICATE
    deliver(log, 5, b"a packed row", 3)
    assert deliver(log, 5, b"its first delta alone", 1) is Placement.DUPLICATE  # a live writer's framing
    deliver(log, 10, b"a held row", 3)
    assert deliver(log, 10, b"its first delta alone", 1) is Placement.HELD_AGAIN


class _Session:
    def __init__(self, partition: int, held: bytes = b"") -> None:
        self.partition = partition
        self.held = held

    def held_bytes(self) -> int:
        return len(self.held)


def test_the_session_table_evicts_the_least_recently_used():
    table: SessionTable[_Session] = SessionTable(2)
    a, b, c = _Session(0), _Session(0), _Session(1)
    table.put("a", a)
    table.put("b", b)
    assert table.get("a") is a  # now b is the least recently used
    table.put("c", c)
    assert table.evict() == [("b", b)]
    assert table.get("b") is None and len(table) == 2


def test_sessions_holding_records_leave_memory_past_the_held_byte_budget():
    table: SessionTable[_Session] = SessionTable(10, held_budget=10)
    sessions = {"quiet": _Session(0), "a": _Session(0, b"123456"), "b": _Session(0, b"1234"),
                "c": _Session(0, b"12345")}
    for name, session in sessions.items():
        table.put(name, session)
    assert table.evict() == [("a", sessions["a"])]  # 15 bytes held: the least recently used holder goes
    assert table.evict() == [] and len(table) == 3


def test_a_revoked_partition_takes_its_sessions_out_at_once():
    table: SessionTable[_Session] = SessionTable(10)
    for name, partition in (("a", 0), ("b", 1), ("c", 0)):
        table.put(name, _Session(partition))
    table.put("a", _Session(1))  # the same id again, now on partition 1
    assert sorted(name for name, _ in table.drop_partitions({0})) == ["c"]
    assert sorted(name for name, _ in table.drop_partitions({1})) == ["a", "b"]
    assert len(table) == 0


def test_the_session_table_needs_room_for_one():
    with pytest.raises(ValueError, match="at least one session, not 0"):
        SessionTable(0)


@pytest.fixture(params=["file", "memory"])
def where(request, tmp_path):
    return tmp_path / "state" / "service.sqlite" if request.param == "file" else None


def test_a_transaction_commits_or_rolls_back_whole(where):
    database = Database(where, "test-store", 1, ["CREATE TABLE t (x INTEGER)"])
    try:
        with database.transaction() as db:
            db.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(RuntimeError), database.transaction() as db:
            db.execute("INSERT INTO t VALUES (2)")
            raise RuntimeError("half way")
        assert database.connection.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        database.close()


def test_a_file_keeps_its_kind_and_layout_and_refuses_others(tmp_path):
    path = tmp_path / "views.sqlite"
    Database(path, "view-store", 1, ["CREATE TABLE t (x INTEGER)"]).close()
    Database(path, "view-store", 1, ["CREATE TABLE t (x INTEGER)"]).close()  # its own file again
    with pytest.raises(StateStoreError, match=r"views.sqlite: a 'view-store' store in layout 1, not the "
                                              r"'auditor-state' store in layout 3 this service writes"):
        Database(path, "auditor-state", 3, [])
    with pytest.raises(StateStoreError, match=r"in layout 1, not the 'view-store' store in layout 2"):
        Database(path, "view-store", 2, [])


def test_a_file_without_a_layout_record_is_refused(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE sessions (session_id TEXT)")
    with pytest.raises(StateStoreError, match=r"old.sqlite: no layout record, so not the 'view-store' store"):
        Database(path, "view-store", 1, [])


def test_an_unusable_path_is_a_named_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateStoreError, match=r"file/views.sqlite: cannot create its folder"):
        Database(blocker / "views.sqlite", "view-store", 1, [])


def test_a_commit_the_group_refuses_after_moving_on_is_logged_not_fatal(tmp_path, caplog):
    import asyncio

    from aiokafka import TopicPartition

    from consumers.projector import Projection, ProjectorConfig
    from consumers.runtime import ConsumerService
    from tests.policy_driver import KAFKA, NAMES, Fetched, RecordingOutputs

    class MovedOn(RecordingOutputs):
        async def commit(self, offsets) -> bool:
            return False  # as ProducerOutputs answers aiokafka's CommitFailedError

    policy = Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite"))
    outputs = MovedOn()
    service = ConsumerService(policy.config, policy, outputs)

    async def scenario() -> None:
        await policy.open(outputs)
        service.handle_batch({TopicPartition(NAMES.events, 0): [Fetched(b"s", b"not a record", [], offset=4)]})
        await service.checkpoint()  # the group moved on: raises nothing
        await policy.close(True)

    asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(line.startswith(f"offsets of {NAMES.events} [0] not committed, the group moved on") for line in said)


def test_a_snapshot_s_held_rows_are_written_as_a_difference():
    from consumers.runtime.database import HELD_SCHEMA, load_held, replace_held
    db = sqlite3.connect(":memory:")
    db.execute(HELD_SCHEMA)
    replace_held(db, "s", [(5, b"five", 1), (6, b"six", 1)])
    writes: list[str] = []
    db.set_trace_callback(writes.append)
    replace_held(db, "s", [(6, b"six", 1), (8, b"eight", 1)])  # 5 drained, 8 arrived, 6 kept
    assert load_held(db, "s") == [(6, b"six", 1), (8, b"eight", 1)]
    assert [statement for statement in writes if statement.startswith(("INSERT", "DELETE"))] == [
        "DELETE FROM held WHERE session_id = 's' AND seq = 5",
        f"INSERT INTO held (session_id, seq, value, count) VALUES ('s', 8, x'{b'eight'.hex()}', 1)"]  # 6 untouched
