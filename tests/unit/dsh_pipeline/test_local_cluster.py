"""The cluster launcher's own decisions, without starting a node."""

from __future__ import annotations

import uuid

from dsh_pipeline import local_cluster


def test_a_cluster_id_never_starts_with_a_dash_the_storage_tool_would_read_as_an_option(monkeypatch):
    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x00" * 15 + b"\x01")])
    monkeypatch.setattr(local_cluster.uuid, "uuid4", lambda: next(drawn))
    assert local_cluster._cluster_id() == "AAAAAAAAAAAAAAAAAAAAAQ"
