"""Redrive on the real broker: a record a buggy projector dead-lettered goes
back to the events topic once the bug is fixed, and the held session heals;
redriving again sends nothing, and forcing it changes no view."""

from __future__ import annotations

import asyncio
import json

import pytest

from consumers.projector.outcomes import OutcomeIndex, OutcomeIndexConfig
from consumers.projector.projected_session import ProjectedSession
from consumers.projector.store import ViewStore
from dsh_core.errors import DecodeError
from dsh_kafka.config import Secret
from dsh_kafka.topics import TopicNames
from dsh_pipeline.cli import main
from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import caught_up, end_offsets
from tests.services import projector
from tests.waiting import until

pytestmark = pytest.mark.kafka

KEY = Secret("redrive-key-of-these-tests-" + "0" * 16)


@pytest.fixture(autouse=True)
def redrive_key_file(tmp_path, monkeypatch):
    """The redrive key, given to the redrive command as a deployment does."""
    path = tmp_path / "redrive.key"
    path.touch(0o600)
    path.write_text(KEY.reveal() + "\n")
    monkeypatch.setenv("DSH_REDRIVE_KEY_FILE", str(path))
    return path


def _view(store_path, session_id: str) -> dict | None:
    if not store_path.exists():
        return None
    store = ViewStore(store_path)
    try:
        return store.view(session_id)
    finally:
        store.close()


def _letters(store_path) -> int:
    store = ViewStore(store_path)
    try:
        return store.db.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0]
    finally:
        store.close()


async def _run_until(kafka, names, group: str, db, condition, what: str) -> None:
    stop = asyncio.Event()
    services = [projector(kafka, names, group, db, redrive_key=KEY),
                OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=f"{group}-outcomes", store=db))]
    tasks = [asyncio.create_task(service.run(stop)) for service in services]
    try:
        await until(lambda: any(task.done() for task in tasks) or condition(services[0]), 90, what)
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def test_a_redriven_dead_letter_heals_its_session_and_twice_changes_nothing(kafka, topics, group_id, tmp_path,
                                                                          monkeypatch, capsys):
    names = topics(partitions=3)
    prefix = names.events[:-len(TopicNames().events)]
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=4, seed=31, min_turns=2, max_turns=3)))
    victim = truths[0]
    db, group = tmp_path / "views.sqlite", group_id("projector")
    applying = ProjectedSession.apply

    def buggy(session: ProjectedSession, value: bytes, count: int) -> bool:
        if session.session_id == victim.session_id and session.fold.count == 5:
            raise DecodeError("a bug of this build")
        return applying(session, value, count)

    monkeypatch.setattr(ProjectedSession, "apply", buggy)
    asyncio.run(_run_until(kafka, names, group, db, lambda _: (_view(db, victim.session_id) or {}).get(
        "status") == "held" and _letters(db) == 1, "the victim held and its record dead-lettered"))
    monkeypatch.setattr(ProjectedSession, "apply", applying)  # the fix

    def redrive(*extra: str) -> str:
        assert main(["dead-letters", "--redrive", "--store", str(db), "--bootstrap", kafka.bootstrap,
                     "--topic-prefix", prefix, "--session", victim.session_id, *extra]) == 0
        return capsys.readouterr().out

    assert "1 sent back" in redrive()
    asyncio.run(_run_until(kafka, names, group, db, lambda _: (_view(db, victim.session_id) or {}).get(
        "nextSeq") == victim.next_seq, "the victim healed"))
    view = _view(db, victim.session_id)
    assert (view["status"], view["messagesDigest"]) == ("idle", victim.messages_digest)
    assert "0 sent back to" in redrive() and "1 sent before" in redrive()
    assert "1 sent back" in redrive("--again")
    ends = asyncio.run(end_offsets(kafka, names.events))
    asyncio.run(_run_until(kafka, names, group, db, lambda service: caught_up(service, ends),
                           "the projector read the record sent again"))
    assert _view(db, victim.session_id) == view


def test_letters_of_one_record_are_one_and_a_redrive_run_again_adds_none(kafka, topics, group_id, tmp_path, capsys):
    """One undecodable record, dead-lettered by two projector groups (a
    rebuild beside the running one) and the archiver: listed once, sent back
    once, refused again without new letters, however often redrive runs."""
    from dsh_core.session_header import SessionHeader
    from dsh_kafka.records import KIND_RECORD, SessionRecord, header_record
    from tests.kafka_fixtures import publish_records
    from tests.services import archiver
    names = topics(partitions=2)
    prefix = names.events[:-len(TopicNames().events)]
    header = SessionHeader(id="s-bad", createdAt=5, delegationDepth=0)
    headed = header_record(header)  # and the bad record names its writer, as its producer would
    asyncio.run(publish_records(kafka, names, [headed, SessionRecord("s-bad", KIND_RECORD, 0, 1, b'{"seq": 0, "type": ',
                                                                     writer=headed.writer)]))
    db, group = tmp_path / "views.sqlite", group_id("projector")

    async def run_services() -> None:  # until each read the events topic to its end, then drain
        stop = asyncio.Event()
        ends = await end_offsets(kafka, names.events)
        consumers = [projector(kafka, names, group, db, redrive_key=KEY),
                     projector(kafka, names, f"{group}-rebuild", tmp_path / "rebuild.sqlite", redrive_key=KEY),
                     archiver(kafka, names, f"{group}-archiver", tmp_path / "archive", redrive_key=KEY)]
        index = OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=f"{group}-outcomes", store=db))
        tasks = [asyncio.create_task(service.run(stop)) for service in (*consumers, index)]
        try:
            await until(lambda: any(task.done() for task in tasks) or all(caught_up(c, ends) for c in consumers), 90,
                        "every service read the events topic")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        letters = sum((await end_offsets(kafka, names.dead_letter)).values())
        index = OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=f"{group}-outcomes", store=db))
        await _index_until(index, lambda: _letters(db) == letters)

    def letters_on_topic() -> int:
        return sum(asyncio.run(end_offsets(kafka, names.dead_letter)).values())

    def run(*argv: str) -> tuple[int, str, str]:
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    asyncio.run(run_services())
    assert letters_on_topic() == 3  # each service and group wrote its own
    status, out, _ = run("dead-letters", "--store", str(db))
    assert status == 0 and len(out.splitlines()) == 1 and "(3 letters)" in out and "corrupt-storage" in out
    redrive = ("dead-letters", "--redrive", "--store", str(db), "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix)
    assert "1 sent back to" in run(*redrive)[1]
    asyncio.run(run_services())
    assert letters_on_topic() == 3  # refused again, for the same reason: no new letter
    assert "0 sent back to" in run(*redrive)[1]  # cron-safe
    assert "1 sent back to" in run(*redrive, "--again")[1]
    asyncio.run(run_services())
    assert letters_on_topic() == 3
    status, out, _ = run("dead-letters", "--store", str(db), "--json")
    assert [(letter["topic"], letter["offset"], letter["copies"]) for letter in map(json.loads, out.splitlines())] \
        == [(names.events, 1, 3)]  # where the record was first read
    status, _, err = run("dead-letters", "--again", "--store", str(db))
    assert status == 2 and "--again goes with --redrive" in err


async def _index_until(index, condition) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(index.run(stop))
    try:
        await until(lambda: task.done() or condition(), 60, "the dead letters indexed")
    finally:
        stop.set()
        await task

