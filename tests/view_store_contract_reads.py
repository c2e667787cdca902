"""The view store's contract, its reads: what
:class:`~consumers.projector.store_reader.StoreReader` finds in what the
projector stored (a part of :class:`tests.view_store_contract.ViewStoreContract`)."""

from __future__ import annotations

import base64
import datetime
import json
from typing import ClassVar

import msgspec
import pytest

from consumers.projector.reader import SessionFilter
from consumers.projector.store import TOKEN_COLUMNS, SessionChange, ViewStore
from consumers.projector.store_reader import StoreReader
from consumers.runtime.store_backends import Backend
from consumers.runtime.errors import StateStoreError
from dsh_kafka.records import SessionRecord, wire_attestation_record
from dsh_core.jsonvalue import encode_json, thaw
from dsh_pipeline.prices import Price, PriceTable
from producers.simulator import SimulatorConfig, simulate_session
from tests.view_store_helpers import project, stored_fleet


def _with_text(records, text: str):
    """The records with ``text`` put before the text of every user message."""
    escaped = encode_json(text)[1:-1]
    return [msgspec.structs.replace(record, value=record.value.replace(b'"type":"text","text":"',
                                                                       b'"type":"text","text":"' + escaped))
            if b'"type":"user/message"' in record.value else record for record in records]


class ReadsContract:
    """The reader's tests of the contract."""

    backend: ClassVar[Backend]

    def test_the_reader_lists_filters_and_pages_thesimulated_fleet(self, store_location):
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
            huge = base64.urlsafe_b64encode(f"activity\x1f{2 ** 70}\x1fsim".encode()).decode()
            with pytest.raises(ValueError, match="is not one this store gave"):
                reader.sessions(SessionFilter(), huge)
        finally:
            reader.close()

    def test_the_list_is_ordered_and_paged_by_the_cost_it_shows(self, store_location):
        fleet = stored_fleet(store_location)
        ids = [truth.session_id for truth, _ in fleet]
        store = ViewStore(store_location)
        try:  # a second model the prices do not name, in one session: it has no cost
            with store.database.transaction() as db:
                db.execute("INSERT INTO usage (session_id, provider, model, inputTokens) VALUES (?, ?, ?, ?)",
                           (ids[2], "deepseek", "unpriced", 10))
        finally:
            store.close()
        reader = StoreReader(store_location)
        try:
            models = sorted({(m["provider"], m["model"]) for item in reader.sessions(SessionFilter(), limit=200)[
                "items"] for m in item["models"]} - {("deepseek", "unpriced")})
            prices = [Price(model=model, input=0.5 + index, output=2.0 + index, cache_read=0.1, cache_write=0.3)
                      for index, (_, model) in enumerate(models)]
            prices.append(Price(model=models[0][1], provider=models[0][0], input=7.0, output=9.0))  # its own wins
            table = PriceTable(prices, datetime.date(2026, 12, 1), "a test")

            def expected(item) -> float | None:
                costs = [table.cost(m["provider"], m["model"], m) for m in item["models"]]
                return None if None in costs else sum(costs)

            seen, cursor = [], None
            while True:
                page = reader.sessions(SessionFilter(), cursor, limit=2, order="cost", prices=table.prices)
                seen += page["items"]
                if (cursor := page["next"]) is None:
                    break
            assert sorted(item["sessionId"] for item in seen) == sorted(ids)  # each once
            for item in seen:
                assert item["costUsd"] == (None if expected(item) is None else pytest.approx(expected(item), abs=2e-6))
            shown = [(-1 if item["costUsd"] is None else item["costUsd"], item["sessionId"]) for item in seen]
            assert shown == sorted(shown, reverse=True)  # the cost shown is the order; no price: last
            assert seen[-1]["sessionId"] == ids[2] and seen[-1]["costUsd"] is None
            assert len({item["costUsd"] for item in seen}) > 3
            by_activity = reader.sessions(SessionFilter(), limit=200, prices=table.prices)["items"]
            assert {i["sessionId"]: i["costUsd"] for i in by_activity} == {i["sessionId"]: i["costUsd"] for i in seen}
            assert "costUsd" not in reader.sessions(SessionFilter(), limit=1)["items"][0]  # no prices, no cost
            dearest = reader.sessions(SessionFilter(status=("idle",)), limit=1, order="cost",
                                       prices=table.prices)  # filters and the cost order together
            assert dearest["items"][0]["sessionId"] == seen[0]["sessionId"] != ids[-1]
            tokens = reader.sessions(SessionFilter(), limit=2, order="tokens")["next"]
            with pytest.raises(ValueError, match=r"pages the sessions by 'tokens', not by 'cost'"):
                reader.sessions(SessionFilter(), tokens, order="cost", prices=table.prices)
            with pytest.raises(ValueError, match=r"pages the sessions by 'cost', not by 'activity'"):
                reader.sessions(SessionFilter(), page_cursor := reader.sessions(
                    SessionFilter(), limit=2, order="cost", prices=table.prices)["next"])
            assert page_cursor is not None
            nan = base64.urlsafe_b64encode("cost\x1fnan\x1fsim".encode()).decode()
            with pytest.raises(ValueError, match="is not one this store gave"):
                reader.sessions(SessionFilter(), nan, order="cost", prices=table.prices)
        finally:
            reader.close()

    def test_a_gateways_requests_show_at_their_steps_and_go_with_their_session(self, store_location):
        fleet = stored_fleet(store_location)
        session_id = fleet[0][0].session_id
        reader = StoreReader(store_location)
        try:
            steps = reader.session_page(session_id, None, 200)["steps"]
        finally:
            reader.close()
        assert steps and all(step["gateway"] == [] for step in steps)

        def attested(arrival: int, received: int, **fields) -> SessionRecord:
            return wire_attestation_record(session_id, arrival, encode_json({
                "gateway": "gw", "kind": "agent", "status": 200, "outcome": "completed", "receivedAt": received,
                "upstream": {"firstByteMs": 5 * arrival, "durationMs": 50 * arrival}, **fields}))

        requests = [attested(10 + index, step["startedAt"]) for index, step in enumerate(steps)]
        requests += [attested(99, steps[0]["startedAt"], kind="title"), requests[0]]  # no step's; a copy
        project(store_location, requests)
        reader = StoreReader(store_location)
        try:
            shown = reader.session_page(session_id, None, 200)["steps"]
            assert [[request["arrival"] for request in step["gateway"]] for step in shown] == [
                [10 + index] for index in range(len(steps))]
            assert shown[0]["gateway"][0] == {"gateway": "gw", "arrival": 10, "status": 200, "outcome": "completed",
                                              "receivedAt": steps[0]["startedAt"], "upstreamFirstByteMs": 50,
                                              "upstreamMs": 500}
            assert reader.session(session_id)["steps"] == shown
        finally:
            reader.close()
        store = ViewStore(store_location)
        try:
            store.delete_session(session_id, 1)
            assert store.db.execute("SELECT COUNT(*) FROM gateway_requests").fetchone()[0] == 0
        finally:
            store.close()
        project(store_location, [attested(200, 1)])  # a deleted session's attestation: nothing kept
        store = ViewStore(store_location)
        try:
            assert store.db.execute("SELECT COUNT(*) FROM gateway_requests").fetchone()[0] == 0
        finally:
            store.close()

    def test_a_session_read_page_by_page_is_the_whole_session(self, store_location):
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
                events = [event for page in pages for event in page["surface"]]
                assert [{k: v for k, v in event.items() if k != "order"} for event in events] == whole["surface"]
                place = {event["seq"]: (event["order"], event["seq"]) for event in events}
                seqs = {k: v for page in pages for k, v in page["messageSeqs"].items()}
                assert sorted((m for page in pages for m in page["messages"]), key=lambda m: place[seqs[m["id"]]]) \
                    == whole["messages"]  # in the model's order: dsh's history
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

    def test_a_reader_never_creates_a_store(self, store_location):
        with pytest.raises(StateStoreError, match=r"(no view store there|not a view store in layout)"):
            StoreReader(store_location)
        store = ViewStore(store_location)  # nothing of another kind or layout was left there
        try:
            assert store.stored(["s-1"]) == set()
        finally:
            store.close()

    def test_text_holding_nul_is_stored_and_found(self, store_location):
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

    @pytest.mark.parametrize("version", [0, 4])
    def test_text_no_store_text_holds_is_kept_exactly_and_found(self, store_location, version):
        """A lone surrogate, NUL and the store's own escape character in message
        text: the session is projected, its surface rows read back exactly and
        a search for the text finds it, on both backends alike."""
        text = "\ud800 nul\x00 \udfff\U0010ffff0; "
        config = SimulatorConfig(sessions=1, seed=77, min_turns=1, max_turns=2, formats=(version,))
        truth, batches = simulate_session(config, 0)
        project(store_location, _with_text([record for batch in batches for record in batch], text))
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
