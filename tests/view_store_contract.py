"""The view store's contract: one suite of tests, run on every backend of
:data:`~consumers.runtime.store_backends.BACKENDS` by a subclass of
:class:`ViewStoreContract` naming it (the in-memory and SQLite runs in
tests/unit/consumers/projector, the PostgreSQL run, a fresh database per
test, in tests/integration/consumers/projector). The writer
(:class:`~consumers.projector.store.ViewStore`, fed by the projector's
policy without a broker) and the reader
(:class:`~consumers.projector.store_reader.StoreReader`) must behave alike
on each."""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest

from consumers.projector import Projection, ProjectorConfig, ViewStore
from consumers.projector.outcomes import verdict_row
from consumers.projector.reader import SessionFilter
from consumers.projector.store import SessionChange, view_head
from consumers.projector.store_reader import StoreReader
from consumers.runtime.database import store_digests
from consumers.runtime.store_backends import Backend
from dsh_kafka.errors import FencedError
from dsh_core.jsonvalue import encode_json, thaw
from dsh_kafka.records import KIND_HEADER, KIND_RECORD
from producers.simulator import messages_digest
from tests.policy_driver import KAFKA, NAMES, Fetched, fetched, run_batch
from tests.store_locations import discard_location, new_location
from tests.view_store_contract_layouts import LayoutsContract
from tests.view_store_contract_reads import ReadsContract
from tests.view_store_helpers import listing_columns, project, simulated_fleet
from tests.writers import second_writer


def _project_in_process(location, seed: int) -> None:
    for truth, records in simulated_fleet(3, seed):
        random.Random(seed).shuffle(records)
        project(location, records)


def _renamed(records, session_id: str):
    """A simulated session's records as those of ``session_id`` (untagged:
    the renamed header is not the one their writer was taken from)."""
    old, new = json.dumps(records[0].session_id).encode(), encode_json(session_id)
    return [msgspec.structs.replace(record, session_id=session_id, value=record.value.replace(old, new), writer="")
            for record in records]


class ViewStoreContract(ReadsContract, LayoutsContract):
    """The tests every view-store backend passes (collected through the
    subclasses, each of which names its ``backend``): those of writes here,
    of reads and layouts in the two classes it takes them from."""

    backend: ClassVar[Backend]

    def server(self, request: pytest.FixtureRequest) -> str | None:
        """The server a new location is made on (none: the backend needs none)."""
        return None

    @pytest.fixture
    def store_location(self, request: pytest.FixtureRequest, tmp_path: Path):
        """A new location on the backend, nothing stored there yet."""
        server = self.server(request)
        location = new_location(self.backend, tmp_path, server)
        yield location
        discard_location(location, server)

    def test_views_and_their_listing_equal_ground_truth(self, store_location):
        fleet = simulated_fleet(5, seed=71)
        project(store_location, [record for _, records in fleet for record in records])
        store = ViewStore(store_location)
        try:
            for truth, records in fleet:
                view = store.view(truth.session_id)
                assert (view["status"], view["nextSeq"], view["messagesDigest"]) == (
                    "idle", truth.next_seq, truth.messages_digest)
                messages = thaw(store.fold(truth.session_id).state.messages())
                assert messages_digest(messages) == truth.messages_digest
                status, next_seq, turns, message_count, cwd, created_at, _ = listing_columns(store, truth.session_id)
                header = view["header"]
                assert (status, next_seq, turns, message_count, cwd, created_at) == (
                    "idle", truth.next_seq, truth.turns, len(messages), header.get("cwd"), header["createdAt"])
                usage = store.db.execute("SELECT provider, model, inputTokens, outputTokens FROM usage "
                                         "WHERE session_id = ? ORDER BY provider, model", (truth.session_id,)).fetchall()
                assert [tuple(row) for row in usage] == sorted(
                    (u["provider"], u["model"], u.get("inputTokens", 0), u.get("outputTokens", 0)) for u in view["usage"])
        finally:
            store.close()

    def test_held_records_survive_a_reopen_and_the_session_heals(self, store_location):
        [(truth, records)] = simulated_fleet(1, seed=72)
        late = next(index for index, record in enumerate(records) if record.kind == KIND_RECORD and record.seq > 4)
        project(store_location, records[:late] + records[late + 1:])
        store = ViewStore(store_location)
        try:
            status, _, _, held = store.load(truth.session_id)
            assert status == "held" and [seq for seq, _, _ in held] == sorted(
                r.seq for r in records[late + 1:] if r.kind == KIND_RECORD)
            assert store.digest(truth.session_id, records[1].seq) is not None
        finally:
            store.close()
        project(store_location, [records[late]])
        store = ViewStore(store_location)
        try:
            view = store.view(truth.session_id)
            assert (view["status"], view["nextSeq"], store.load(truth.session_id)[3]) == ("idle", truth.next_seq, [])
        finally:
            store.close()

    def test_a_conflicted_session_stays_conflicted_and_its_first_writer_keeps_flowing(self, store_location):
        [(truth, records)], [(_, other)] = simulated_fleet(1, seed=74), simulated_fleet(1, seed=75)
        second = [r for r in second_writer(records, other) if r.kind in (KIND_HEADER, KIND_RECORD)]
        cut = len(records) // 2
        assert len(second) > cut + 3  # its seqs overlap the first writer's and go past them
        project(store_location, records[:cut] + second)
        project(store_location, records[cut:] + second[-1:])  # reopened: the second writer is still kept out
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

    def test_a_head_stays_unacknowledged_until_acknowledged(self, store_location):
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

    def test_a_member_whose_partition_was_claimed_again_writes_nothing(self, store_location):
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

    def test_two_processes_write_one_store_at_once(self, store_location):
        if not self.backend.shared:
            pytest.skip(f"a {self.backend.name} store is seen by the process that made it only")
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

    def test_a_batch_of_many_rows_upserts_and_a_rolled_back_one_leaves_nothing(self, store_location):
        """Hundreds of rows in one statement (PostgreSQL copies them in through
        a staging table, kept for the connection's later batches): conflicts
        update, NUL text survives, and a batch that fails leaves neither its
        rows nor a stale staging table behind, nor forgets the one an
        earlier batch made."""
        store = ViewStore(store_location)
        try:
            def rows(count: int, marker: bytes) -> dict[int, tuple[int, bytes]]:
                return {seq: (seq % 3 + 1, marker * 32) for seq in range(1, count + 1)}

            with store.database.transaction() as db:
                store_digests(db, [("first", rows(100, b"a"))])
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
            assert store.digest("first", 100) == rows(100, b"a")[100]
            assert store.db.execute("SELECT count(*) FROM applied").fetchone()[0] == 500
        finally:
            store.close()

    def test_a_deleted_session_is_never_written_again(self, store_location):
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

    @pytest.mark.parametrize("batches", [1, 2])
    def test_two_session_ids_told_apart_only_by_nul_never_share_a_row(self, store_location, batches):
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

    def test_rows_a_store_refuses_for_their_content_refuse_their_session_alone(self, store_location):
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

    def test_the_index_keeps_each_session_s_latest_counts(self, store_location):
        def record(offset: int, value: bytes) -> Fetched:
            return Fetched(b"s-1", value, [], offset, topic=NAMES.verdicts)

        rows = [verdict_row(record(offset, json.dumps(
            {"session": "s-1", "attested": {"verified": offset}, "wire": {"agent": {"verified": 1}}}).encode()))
            for offset in (4, 9)]
        assert verdict_row(record(10, b'{"session": "s-1"}')) is None and verdict_row(record(11, b"\xff")) is None
        store = ViewStore(store_location)
        try:
            store.index_outcomes([], [], rows[:1], {(NAMES.verdicts, 0): 5})
            store.index_outcomes([], [], rows[1:], {(NAMES.verdicts, 0): 10})
            assert [tuple(row) for row in store.db.execute(
                "SELECT session_id, counts, \"offset\" FROM audit_verdicts")] == [
                ("s-1", '{"attested":{"verified":9},"wire":{"agent":{"verified":1}}}', 9)]
            assert store.outcome_offsets() == {(NAMES.verdicts, 0): 10}
            store.delete_session("s-1", 1700000000000)
            assert store.db.execute("SELECT count(*) FROM audit_verdicts").fetchone()[0] == 0
        finally:
            store.close()
        reader = StoreReader(store_location)
        try:
            assert reader.session("s-1") is None
        finally:
            reader.close()
