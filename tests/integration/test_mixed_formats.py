"""v0, v3 and v4 sessions side by side in one topic, shipped from a dsh
sessions root through projector, auditor and archiver (real broker): every
view is what dsh derives, nothing is reported, every archive file is the
shipped log in its format's naming (with, beside each v0 and v3 session,
the v4 log dsh migrates it to), and every record names its format."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from consumers.archiver.files import existing_file
from consumers.projector import ViewStore
from dsh_core.errors import DshError
from dsh_core.jsonvalue import thaw
from dsh_core.storage.layout import log_path
from dsh_core.loader import load_session, read_events
from dsh_core.formats.v4.header import parse_header
from dsh_core.migration.migrate import V4_NAME, migrate, migrated_log, v4_file
from dsh_kafka.admin import cluster_id
from producers.publisher import Publisher
from producers.shipper import Destination, Shipper, ShipperConfig
from tests.conftest import canonical, corpus_logs, expected_of
from tests.integration.test_corpus_pipeline import AUDIT_EXCEPTIONS
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import caught_up, consume_all, end_offsets
from tests.layout_helpers import place
from tests.services import archiver, auditor, projector
from tests.unit.dsh_core.test_fold_snapshot_v4 import LOGS, stored_lines

pytestmark = pytest.mark.kafka


def _place_v4(root: Path, log: Path) -> Path:
    """A v3/v4 fixture log where dsh keeps it, beside the lock file dsh holds."""
    header = parse_header(json.loads(stored_lines(log)[0]), str(log))
    path = log_path(root, header.cwd, header.id, "zstd", header.version)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(log, path)
    (path.parent / "session.lock").write_bytes(b"")
    return path


def test_v0_v3_and_v4_sessions_share_a_topic_end_to_end(kafka, topics, group_id, tmp_path):
    names = topics(partitions=4)
    root, archive = tmp_path / "root", tmp_path / "archive"
    expected: dict[str, tuple[Path, dict]] = {}  # session id -> (the file shipped, what dsh derives)
    for log in LOGS:
        path = _place_v4(root, log)
        expected[parse_header(json.loads(stored_lines(log)[0]), "").id] = (
            path, json.loads(log.with_name(log.name.split(".")[0] + ".expected.json").read_text()))
    migrated_v3 = next(path for path, _ in expected.values() if path.name == "session.v3.jsonl.zstd")
    migrated = migrate(migrated_v3)  # dsh's upgrade leaves both: the newest generation is the session's
    expected = {sid: ((migrated, want) if path == migrated_v3 else (path, want)) for sid, (path, want) in expected.items()}
    v0 = [log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"] and expected_of(log)["repair"] is None
          and log.stem not in AUDIT_EXCEPTIONS]
    for index, log in enumerate(v0[:12]):
        want = expected_of(log)
        if want["sessionHeader"]["id"] not in expected:
            path = place(root, log.read_bytes(), "zstd" if index % 2 else "none")
            expected[want["sessionHeader"]["id"]] = (path, want)
    formats = {sid: load_session(path).header.version for sid, (path, _) in expected.items()}
    assert sorted(set(formats.values())) == [0, 3, 4]

    async def run() -> tuple[list, list]:
        async with Publisher(kafka, names) as publisher:
            await Shipper(ShipperConfig(root, tmp_path / "state", once=True), publisher.send, publisher.flush,
                          report=pytest.fail, say=print,
                          destination=Destination(await cluster_id(kafka), names.events)).run(asyncio.Event())
        ends = await end_offsets(kafka, names.events)
        services = [projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite", hot_sessions=3),
                    auditor(kafka, names, group_id("auditor"), hot_sessions=3),
                    archiver(kafka, names, group_id("archiver"), archive, hot_sessions=3, v4_copies=True)]
        await asyncio.gather(*(run_until(service, lambda s=service: caught_up(s, ends)) for service in services))
        events = await consume_all(kafka, names.events, 100_000, timeout=3)
        return events, await consume_all(kafka, names.findings, 10_000, timeout=3, committed_only=True)

    events, findings = asyncio.run(run())
    assert [(finding["rule"], finding["session"]) for finding in (json.loads(r.value) for r in findings)] == []
    for record in events:  # each record names its session's format
        assert dict(record.headers)["dsh-format"] == str(formats[record.key.decode()]).encode()
    store = ViewStore(tmp_path / "views.sqlite")
    try:
        for session_id, (path, want) in expected.items():
            view = store.view(session_id)
            assert view is not None and view["status"] == "idle", (path, view and view.get("error"))
            assert canonical(thaw(store.fold(session_id).state.messages())) == canonical(want["derivedMessages"]), path
            assert view["surfaceLength"] == len(load_session(path).state.surface.nodes), path
    finally:
        store.close()
    copied = {0: 0, 3: 0}
    for session_id, (path, _) in expected.items():  # archived in its format's naming, the shipped log
        archived = existing_file(archive, session_id, "zstd")
        assert archived.name == (path.name if path.name.endswith(".zstd") else path.name + ".zstd")
        assert read_events(archived) == read_events(path), path
        assert load_session(archived).accepted
        copy = archived.parent / V4_NAME
        if formats[session_id] == 4:
            assert not list(archived.parent.glob("*.tmp")) and copy == archived
            continue
        try:  # what `migrate` writes beside the source (and dsh 0.2.1rc2 continues: test_real_dsh_021)
            migrated = v4_file(migrated_log(path))
        except DshError:  # dsh refuses to migrate many of dsh's own early v0 logs: no copy then
            assert not copy.exists(), path
            continue
        assert copy.read_bytes() == migrated, path
        copied[formats[session_id]] += 1
    assert copied[0] >= 1 and copied[3] >= 1, copied
