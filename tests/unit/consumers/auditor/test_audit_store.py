"""The auditor's state file belongs to one group on one topic."""

from __future__ import annotations

import sqlite3

import pytest

from consumers.auditor import AuditStore, SavedSession
from dsh_core.errors import StateStoreError


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
                                              r"layout 4 this service writes; give the service a path of its own"):
        AuditStore(path, "dsh-auditor", "dsh.session-events")
