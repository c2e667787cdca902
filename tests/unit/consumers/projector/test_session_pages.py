"""A page of a session costs what the page holds, whatever the session
holds: a session of many MB read a page at a time reads that page's rows
only, and a long text is cut to a preview with its size."""

from __future__ import annotations

import sqlite3
import tracemalloc

from consumers.projector.session_pages import PAGE_BYTES, PREVIEW_CHARS, model_order, page_of, preview
from consumers.projector.store_reader import StoreReader
from dsh_core.jsonvalue import encode_json
from tests.view_store_helpers import stored_fleet

EVENTS, TEXT = 2_000, 8_000  # 16 MB of surface rows


def test_a_page_of_a_large_session_reads_that_page_only(tmp_path):
    location = tmp_path / "views.sqlite"
    session_id = stored_fleet(location, count=2)[0][0].session_id
    with sqlite3.connect(location) as db:
        db.execute("DELETE FROM surface WHERE session_id = ?", (session_id,))
        db.executemany("INSERT INTO surface (session_id, seq, type, data) VALUES (?, ?, 'user/message', ?)",
                       [(session_id, seq, encode_json({"id": f"m-{seq}", "role": "user", "source": {"kind": "user"},
                                                       "content": [{"type": "text", "text": f"{seq}" * TEXT}]}).decode())
                        for seq in range(EVENTS)])
    reader = StoreReader(location)
    try:
        tracemalloc.start()
        page = reader.session_page(session_id, 1_000, 10)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert [event["seq"] for event in page["surface"]] == list(range(1_001, 1_011)) and page["next"] == "1010"
        assert page["surfaceCount"] == EVENTS  # counted by the store, not from what was read
        assert peak < 2_000_000, f"a page of 10 events of a 16 MB session took {peak} bytes at peak"
        cut = page["surface"][0]
        assert len(cut["data"]["content"][0]["text"]) == PREVIEW_CHARS
        whole = reader.surface_event(session_id, 1_001)
        assert cut["preview"] == {"size": len(encode_json(whole["data"]))}
        assert len(whole["data"]["content"][0]["text"]) == 4 * TEXT
        assert page["messages"][0] == cut["data"]
    finally:
        reader.close()


def test_a_preview_cuts_every_long_string_and_says_so():
    data = {"a": ["x" * (PREVIEW_CHARS + 1), {"b": "short"}], "n": 1}
    assert preview(data) == ({"a": ["x" * PREVIEW_CHARS, {"b": "short"}], "n": 1}, True)
    assert preview({"a": ["short", 2]}) == ({"a": ["short", 2]}, False)


def test_a_page_ends_past_its_bytes_and_the_pages_still_hold_every_event():
    rows = [(seq, "user/message", {"id": f"m-{seq}", "role": "user", "source": {"kind": "user"},
                                   "content": [{"type": "text", "text": f"{seq % 10}" * PREVIEW_CHARS}] * 3}, 1000 + seq)
            for seq in range(300)]
    pages, after = [], None
    while True:
        page = page_of({}, [row for row in rows if after is None or row[0] > after], after, 200, (), (), (), None)
        pages.append(page)
        if page["next"] is None:
            break
        after = int(page["next"])
    sizes = [len(encode_json(page["surface"])) for page in pages]
    assert len(pages) == 4 and all(size < PAGE_BYTES + 4 * PREVIEW_CHARS for size in sizes), sizes
    assert [event["seq"] for page in pages for event in page["surface"]] == list(range(300))
    assert [m["id"] for page in pages for m in page["messages"]] == [f"m-{seq}" for seq in range(300)]


def test_the_model_order_is_runs_of_seqs_and_each_event_of_a_page_names_its_run():
    # [0..4]; a compaction replaces 1..2 with 5; 6 appended; a tool result's rewrite replaces 3 with 7
    nodes = [0, 5, 7, 4, 6]
    runs = model_order(nodes)
    assert runs == [[0, 0], [5, 5], [7, 7], [4, 4], [6, 6]]  # 4 and 6 are not neighbours in seq order: 5 is
    assert model_order([0, 1, 2, 9]) == [[0, 9]]  # the seqs' order is the model's: one run
    rows = [(seq, "user/message", {"message": {"id": f"m{seq}", "role": "user", "content": []}}, None)
            for seq in sorted(nodes)]
    page = page_of({}, rows, None, 10, (), (), (), None, runs)
    placed = sorted(page["surface"], key=lambda event: (event["order"], event["seq"]))
    assert [event["seq"] for event in placed] == nodes
    assert {event["order"] for event in page_of({}, rows, None, 10, (), (), (), None)["surface"]} == {0}
