"""Each request header change a log records, as the projector's views and
the read API carry it: where it was logged and what it changed."""

from __future__ import annotations

from consumers.projector import Projection, ProjectorConfig, ViewStore
from dsh_core.analysis import LogAnalysis, header_change
from dsh_core.loader import load_session
from producers.session_tail import Position, SessionTail
from tests.conftest import corpus_logs
from tests.layout_helpers import place
from tests.policy_driver import KAFKA, fetched, run_batch


def test_a_change_names_only_what_changed():
    before = {"system": "be brief", "tools": [{"name": "bash", "schema": 1}, {"name": "read"}],
              "config": {"model": "m", "reasoningEffort": "high", "temperature": 0}}
    after = {"system": "be brief", "tools": [{"name": "bash", "schema": 2}, {"name": "write"}],
             "config": {"model": "m", "reasoningEffort": "off"}}
    assert header_change(before, after) == {"toolsAdded": ["write"], "toolsRemoved": ["read"],
                                            "toolsChanged": ["bash"], "config": {"reasoningEffort": "off"},
                                            "configRemoved": ["temperature"]}
    assert header_change(None, before) == {"system": "be brief", "toolsAdded": ["bash", "read"],
                                           "config": before["config"]}
    assert header_change(before, before) == {}


def test_the_view_carries_every_change_across_batches_and_evictions(tmp_path):
    log = next(log for log in corpus_logs("dsh-real")
               if log.name == "examples-headless-agent-tests-snapshots-headless-profile-session-expected.jsonl")
    analysis = LogAnalysis(keep_requests=False)
    assert load_session(log, observer=analysis).accepted
    expected = analysis.header_changes
    assert [change["reason"] for change in expected] == ["initial", "change"]
    assert expected[1] == {"seq": expected[1]["seq"], "reason": "change", "config": {"reasoningEffort": "off"}}
    records = list(SessionTail(place(tmp_path / "source", log.read_bytes(), "zstd"), Position()))
    config = ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite", hot_sessions=1)
    for start in range(0, len(records), 7):  # a fresh policy each batch: the session is restored from the store
        run_batch(Projection(config), fetched(records[start:start + 7]))
    store = ViewStore(config.store)
    try:
        assert store.view(records[0].session_id)["requestHeaderChanges"] == expected
    finally:
        store.close()
