"""The archiver's v4 copies: each v0 and v3 session also archived as the v4
log dsh 0.2.1 migrates it to, beside the shipped file, kept current batch
by batch and across restarts; none where dsh refuses the migration."""

from __future__ import annotations

import logging

from consumers.archiver import Archive, ArchiverConfig
from consumers.archiver.files import existing_file
from dsh_core.storage.layout import find_session_files, generation_of
from dsh_core.loader import load_session, read_events
from dsh_core.migration.migrate import V4_NAME, migrated_log, v4_file
from producers.session_tail import Position, SessionTail
from producers.simulator import SimulatorConfig, messages_digest, simulate_session
from tests.conftest import corpus_logs
from tests.layout_helpers import place
from tests.policy_driver import KAFKA, fetched, run_batch

#: One session of each format.
_FLEET = SimulatorConfig(sessions=3, seed=83, min_turns=3, max_turns=4, formats=(0, 3, 4))


def _fleet():
    sessions = [simulate_session(_FLEET, index) for index in range(_FLEET.sessions)]
    return [truth for truth, _ in sessions], [[r for batch in batches for r in batch] for _, batches in sessions]


def _assert_copies_current(root, truths) -> None:
    """Each v0/v3 archive file has its migration beside it, byte for byte
    what ``migrate`` writes of the file as it stands; a v4 session has none."""
    for truth in truths:
        shipped = existing_file(root, truth.session_id, "zstd")
        copy = shipped.parent / V4_NAME
        if generation_of(shipped) == 4:
            assert sorted(p.name for p in shipped.parent.iterdir()) == [V4_NAME]
            continue
        assert copy.read_bytes() == v4_file(migrated_log(shipped)), truth.session_id


def test_v0_and_v3_sessions_get_a_current_v4_copy_after_every_batch(tmp_path):
    truths, records = _fleet()
    assert sorted({truth.format for truth in truths}) == [0, 3, 4]
    archive = Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive", v4_copies=True))
    for part in range(3):  # every session grows in each batch
        run_batch(archive, fetched([r for session in records
                                    for r in session[part * len(session) // 3:(part + 1) * len(session) // 3]]))
        _assert_copies_current(archive.config.root, truths)
    by_id = {truth.session_id: truth for truth in truths}
    logs = find_session_files(archive.config.root)  # dsh reads the newest generation: the copy, or the v4 log
    assert [path.name for path in logs] == [V4_NAME] * 3
    for path in logs:
        result = load_session(path)
        truth = by_id[result.header.id]
        assert result.accepted, result.error
        if truth.format != 0:  # dsh's v0 migration changes messages (a system head): checked against dsh elsewhere
            assert messages_digest(result.state.messages()) == truth.messages_digest


def test_a_restart_writes_again_the_copy_of_every_session_it_resumes(tmp_path):
    """A crash between a batch's files and its copies: the batch was not
    committed, so its records come again, and the archiver that resumes the
    files writes the copies, though every record is a duplicate."""
    truths, records = _fleet()
    root = tmp_path / "archive"
    run_batch(Archive(ArchiverConfig(kafka=KAFKA, root=root)), fetched([r for s in records for r in s]))
    assert not list(root.glob(f"*/*/{V4_NAME}.*")) and len(list(root.glob(f"*/*/{V4_NAME}"))) == 1  # the v4 log
    run_batch(Archive(ArchiverConfig(kafka=KAFKA, root=root, v4_copies=True)), fetched([r for s in records for r in s]))
    _assert_copies_current(root, truths)


def test_no_copy_where_dsh_refuses_the_migration_and_the_file_keeps_every_record(tmp_path, caplog):
    log = next(log for log in corpus_logs("dsh-real") if log.name == "apps-web-tests-snapshots-approval-composer.jsonl")
    source = place(tmp_path / "source", log.read_bytes(), "zstd")
    records = list(SessionTail(source, Position()))
    root = tmp_path / "archive"
    archive = Archive(ArchiverConfig(kafka=KAFKA, root=root, v4_copies=True))
    with caplog.at_level(logging.WARNING, "dsh.archiver"):
        run_batch(archive, fetched(records[: len(records) // 2]))
        shipped = existing_file(root, records[0].session_id, "zstd")
        stale = shipped.parent / V4_NAME
        assert not stale.exists()
        stale.write_bytes(b"a copy left from before")  # it must not outlive a refusal
        run_batch(archive, fetched(records[len(records) // 2:]))
    assert read_events(shipped) == read_events(source)
    assert not stale.exists()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "dsh.archiver"]  # once, not per batch
    assert repr(records[0].session_id) in warning and "dsh refuses to migrate it (unsupported-format: " in warning
    assert "cannot acquire a system head" in warning


def test_a_parent_s_copy_catalogues_each_subagent_child_as_it_arrives(tmp_path):
    """dsh's migration catalogues a parent's children from the sessions
    root: the parent's copy is written again when a child is archived."""
    names = ["examples-acp-agent-tests-snapshots-subagent-parallel", "examples-acp-agent-tests-snapshots-subagent-"
             "parallel-session-1", "examples-acp-agent-tests-snapshots-subagent-parallel-session-2"]
    logs = {log.stem: log for log in corpus_logs("dsh-real") if log.stem in names}
    sessions = [list(SessionTail(place(tmp_path / "source", logs[name].read_bytes(), "zstd"), Position()))
                for name in names]
    root = tmp_path / "archive"
    archive = Archive(ArchiverConfig(kafka=KAFKA, root=root, v4_copies=True))
    sizes = []
    for records in sessions:  # the parent, then one child, then the other
        run_batch(archive, fetched(records))
        parent = existing_file(root, sessions[0][0].session_id, "zstd")
        assert (parent.parent / V4_NAME).read_bytes() == v4_file(migrated := migrated_log(parent))
        sizes.append(len(migrated.events))
    assert sizes == [21, 22, 23]  # a catalog entry per child
