"""The archiver across restarts: sessions continue in their archive files,
and records held behind a gap survive a restart until the gap is filled."""

from __future__ import annotations

import asyncio

import pytest

from consumers.archiver import ArchiverConfig, archiver_service
from dsh_kafka.records import KIND_RECORD
from dsh_core.loader import load_session
from dsh_core.storage.layout import find_session_files
from producers.simulator import SimulatorConfig, messages_digest, simulate_session
from tests.integration.handover import hand_over
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import committed_offsets, end_offsets, publish_records

pytestmark = pytest.mark.kafka


def test_restarts_continue_the_files_and_keep_held_records(kafka, topics, group_id, tmp_path):
    names = topics(partitions=3)
    config = SimulatorConfig(sessions=24, seed=71, min_turns=2, max_turns=4)
    truths, halves = [], ([], [])
    for index in range(config.sessions):
        truth, batches = simulate_session(config, index)
        records = [r for batch in batches for r in batch]
        truths.append(truth)
        halves[0].extend(records[: len(records) // 2])
        halves[1].extend(records[len(records) // 2:])
    # one record of the first half is lost for now: its session's later records wait behind the gap
    missing = next(r for r in halves[0] if r.kind == KIND_RECORD and r.count == 1 and r.seq > 5)
    root = tmp_path / "archive"
    archiving = ArchiverConfig(kafka=kafka, topics=names, group=group_id("archiver"), root=root, hot_sessions=5)


    async def archive() -> None:  # one archiver's life: read what its group has not committed, stop
        committed = await committed_offsets(kafka, archiving.group)
        ends = {p: end for p, end in (await end_offsets(kafka, names.events)).items()
                if end > committed.get((names.events, p), 0)}
        archiver = archiver_service(archiving)  # five hot sessions: sessions go cold, come back

        def caught_up() -> bool:
            consumed = {tp.partition: offset for tp, offset in archiver.positions().items()}
            return all(consumed.get(p, 0) >= end for p, end in ends.items())

        await run_until(archiver, caught_up)

    asyncio.run(publish_records(kafka, names, [r for r in halves[0] if r is not missing]))
    asyncio.run(archive())
    asyncio.run(publish_records(kafka, names, halves[1]))
    asyncio.run(archive())
    asyncio.run(publish_records(kafka, names, [missing]))  # re-shipped
    asyncio.run(archive())

    assert_archive_is_the_truth(root, truths)


def assert_archive_is_the_truth(root, truths) -> None:
    archived = {path.parent.name: path for path in find_session_files(root)}
    assert sorted(archived) == sorted(t.session_id for t in truths)
    for truth in truths:
        result = load_session(archived[truth.session_id])
        assert result.accepted and result.stored_count == truth.next_seq, truth.session_id
        assert messages_digest(result.state.messages()) == truth.messages_digest


def test_partitions_come_back_after_another_member_carried_their_files_on(kafka, topics, group_id, tmp_path):
    names = topics(partitions=4)
    config = ArchiverConfig(kafka=kafka, topics=names, group=group_id("archiver"), root=tmp_path / "archive")
    root = config.root
    truths = asyncio.run(hand_over(kafka, names, lambda: archiver_service(config),
                                   SimulatorConfig(sessions=40, seed=72, min_turns=3, max_turns=4)))
    assert_archive_is_the_truth(root, truths)


def test_a_file_removed_under_the_archiver_lets_its_session_go_not_the_service(kafka, topics, group_id, tmp_path):
    import shutil

    from consumers.archiver.files import archive_segment
    from tests.kafka_fixtures import caught_up
    from tests.services import archiver
    from tests.waiting import until
    names = topics(partitions=1)
    truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=3, min_turns=3, max_turns=3), 0)
    records = [record for batch in batches for record in batch]
    root = tmp_path / "archive"

    async def scenario() -> None:
        service = archiver(kafka, names, group_id("archiver"), root)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))

        async def read_to_the_end() -> None:
            ends = await end_offsets(kafka, names.events)
            await until(lambda: task.done() or caught_up(service, ends), 90, "the archiver read the events topic")
        try:
            await publish_records(kafka, names, records[:len(records) // 2])
            await read_to_the_end()
            [folder] = root.glob(f"*/{archive_segment(truth.session_id)}")
            shutil.rmtree(folder)  # delete-session --archive, before the fence reaches the archiver
            await publish_records(kafka, names, records[len(records) // 2:])
            await read_to_the_end()
            assert not task.done()
        finally:
            stop.set()
            await task  # it stopped because it was asked to, and drained
        assert not folder.exists()  # not made again as a file starting at a later seq

    asyncio.run(scenario())


def test_sessions_of_a_header_alone_are_archived_and_stay(kafka, topics, group_id, tmp_path):
    from dsh_core.formats import read_header
    from dsh_core.storage.reader import header_line_of
    from dsh_kafka.records import header_record
    from tests.conftest import corpus_logs

    names = topics(partitions=3)
    logs = [log for log in corpus_logs("dsh-real") if log.read_bytes().count(b"\n") == 1]  # dsh's empty sessions
    assert len(logs) >= 10
    records = [header_record(read_header(log.read_bytes().rstrip(b"\n"), str(log))) for log in logs]
    archiving = ArchiverConfig(kafka=kafka, topics=names, group=group_id("archiver"), root=tmp_path / "archive")

    async def archive() -> None:
        ends = await end_offsets(kafka, names.events)
        archiver = archiver_service(archiving)

        def caught_up() -> bool:
            consumed = {tp.partition: offset for tp, offset in archiver.positions().items()}
            return all(consumed.get(p, 0) >= end for p, end in ends.items() if end)

        await run_until(archiver, caught_up)

    asyncio.run(publish_records(kafka, names, records))
    asyncio.run(archive())
    asyncio.run(publish_records(kafka, names, records))  # shipped again: a restart resumes every file, and
    asyncio.run(archive())  # one holding its header alone stays
    archived = {path.parent.name: path for path in find_session_files(archiving.root)}
    assert len(archived) == len(records)
    for record in records:
        [path] = [path for path in archived.values() if header_line_of(path) == record.value]
        result = load_session(path)
        assert result.accepted and result.event_count == 0, path
