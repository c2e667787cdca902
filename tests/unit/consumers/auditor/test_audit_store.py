"""The auditor's state file belongs to one group on one topic; an earlier layout is migrated, its fold snapshots
saved again in the current layout."""

from __future__ import annotations

import sqlite3

import pytest

from consumers.auditor import AuditStore, SavedSession
from consumers.runtime.errors import StateStoreError
from dsh_core.fold_snapshot import V4_SNAPSHOT_MAGIC, snapshot_fold
from tests.unit.dsh_core.test_fold_snapshot_72cba14 import old_snapshot


def test_a_state_file_keeps_its_owner_and_refuses_others(tmp_path):
    path = tmp_path / "auditor.sqlite"
    store = AuditStore(path, "dsh-auditor", "dsh.session-events")
    store.write({"s1": SavedSession(3, None, b"{}", [(7, b"held", 2)], {9: b"attested"}, {7: (2, b"digest")})}, {3: 42})
    store.close()

    again = AuditStore(path, "dsh-auditor", "dsh.session-events")
    try:
        assert again.stored_offset(3) == 42
        assert again.load("s1") == SavedSession(3, None, b"{}", [(7, b"held", 2)], {9: b"attested"}, {})
        assert again.digest("s1", 7) == (2, b"digest") and again.digest("s1", 8) is None
    finally:
        again.close()

    with pytest.raises(StateStoreError, match=r"group 'dsh-auditor' on 'dsh.session-events', not of group "
                                              r"'other' on 'dsh.session-events'; give each group"):
        AuditStore(path, "other", "dsh.session-events")
    with pytest.raises(StateStoreError, match=r"not of group 'dsh-auditor' on 'x.dsh.session-events'"):
        AuditStore(path, "dsh-auditor", "x.dsh.session-events")


def test_a_state_file_of_another_layout_is_refused(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, topic TEXT)")
    db.commit()
    db.close()
    with pytest.raises(StateStoreError, match=r"old.sqlite: no layout record, so not the 'auditor-state' store in "
                                              r"layout 5 this service writes; give the service a path of its own"):
        AuditStore(path, "dsh-auditor", "dsh.session-events")


def _layout_4_file(path, fold: bytes) -> None:
    """A state file as 72cba14 left it: layout 4, with a fold snapshot it wrote."""
    store = AuditStore(path, "dsh-auditor", "dsh.session-events")
    store.write({"s1": SavedSession(0, fold, b"{}", [], {}, {}), "s2": SavedSession(0, None, b"{}", [], {}, {})}, {})
    with store.database.transaction() as db:
        db.execute("UPDATE dsh_layout SET version = 4")
    store.close()


def test_a_layout_4_state_file_saves_its_pickled_fold_snapshots_again_as_layout_3(tmp_path):
    blob, _, _, never_stopped = old_snapshot("parallel-v4-auditor")
    _layout_4_file(tmp_path / "auditor.sqlite", blob)
    store = AuditStore(tmp_path / "auditor.sqlite", "dsh-auditor", "dsh.session-events")
    try:
        assert store.load("s1").fold == snapshot_fold(never_stopped)
        assert store.load("s2").fold is None
    finally:
        store.close()


def test_a_fold_snapshot_the_migration_cannot_read_stops_it_naming_the_session(tmp_path):
    path = tmp_path / "auditor.sqlite"
    _layout_4_file(path, V4_SNAPSHOT_MAGIC % 2 + b"\x80\x05not a pickle")
    with pytest.raises(StateStoreError, match=r"auditor.sqlite: migrating the 'auditor-state' store from layout 4 to 5: "
                                              r"session 's1': not a fold snapshot: UnpicklingError: .*; give the "
                                              r"service a path of its own"):
        AuditStore(path, "dsh-auditor", "dsh.session-events")
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM dsh_layout").fetchone() == (4,)  # nothing migrated
    db.close()
