"""The reader commands on a store a projection filled: ``sessions``,
``view`` by unique prefix, ``findings``, ``dead-letters``, and the errors
a person gets for a missing store or an ambiguous id."""

from __future__ import annotations

import json
import time

import pytest

from dsh_core.event_time import line_time
from dsh_pipeline.cli import main
from dsh_pipeline.exit_codes import EXIT_OK, EXIT_REFUSED
from tests.view_store_helpers import stored_fleet


def _cluster(kafka, names) -> tuple[str, ...]:
    """The options naming the test's broker and topics."""
    from dsh_kafka.topics import TopicNames
    return "--bootstrap", kafka.bootstrap, "--topic-prefix", names.events[:-len(TopicNames().events)]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_sessions_view_and_findings_read_the_store(tmp_path, capsys):
    store = str(tmp_path / "views.sqlite")
    fleet = stored_fleet(tmp_path / "views.sqlite")
    ids = [truth.session_id for truth, _ in fleet]
    status, out, _ = _run(capsys, "sessions", "--store", store, "--json")
    listed = [json.loads(line) for line in out.splitlines()]
    assert status == EXIT_OK and sorted(item["sessionId"] for item in listed) == sorted(ids)
    assert [item["lastActivity"] for item in listed] == sorted((item["lastActivity"] for item in listed), reverse=True)
    assert {item["sessionId"]: item["lastActivity"] for item in listed if item["status"] != "held"} == {
        truth.session_id: _last_event(records) for truth, records in fleet[:-1]}  # by the logs' own times
    status, out, _ = _run(capsys, "sessions", "--store", store, "--status", "held")
    assert status == EXIT_OK and [line.split()[0] for line in out.splitlines()[1:]] == [ids[-1]]
    status, out, _ = _run(capsys, "view", ids[1][:-4], "--store", store, "--json")
    shown = json.loads(out)
    assert status == EXIT_OK and shown and shown[0]["role"] == "user"
    status, out, _ = _run(capsys, "findings", "--store", store, "--session", ids[1][:-4])
    assert status == EXIT_OK and "request-mismatch" in out and ids[1] in out
    status, out, _ = _run(capsys, "dead-letters", "--store", store)
    assert (status, out) == (EXIT_OK, "")


def test_a_prefix_of_many_sessions_and_a_missing_store_are_named(tmp_path, capsys):
    stored_fleet(tmp_path / "views.sqlite")
    status, _, err = _run(capsys, "view", "sim-", "--store", str(tmp_path / "views.sqlite"))
    assert status == EXIT_REFUSED and "'sim-' starts 6 session ids in" in err and "give more of it" in err
    status, _, err = _run(capsys, "view", "nope", "--store", str(tmp_path / "views.sqlite"))
    assert status == EXIT_REFUSED and "no session 'nope' in" in err
    status, _, err = _run(capsys, "sessions", "--store", str(tmp_path / "none.sqlite"))
    assert status == EXIT_REFUSED and "none.sqlite: no view store there" in err and "Traceback" not in err
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.kafka
def test_delete_session_removes_views_findings_and_archive_and_retention_by_age(kafka, topics, tmp_path, capsys):
    from consumers.archiver.files import archive_segment
    cluster = _cluster(kafka, topics())
    store = str(tmp_path / "views.sqlite")
    ids = [truth.session_id for truth, _ in stored_fleet(tmp_path / "views.sqlite")]
    archive = tmp_path / "archive"
    for session_id in ids[:2]:
        (archive / "project-a" / archive_segment(session_id)).mkdir(parents=True)
        (archive / "project-a" / archive_segment(session_id) / "session.jsonl").write_text("{}\n")
    status, out, _ = _run(capsys, "delete-session", ids[1][:-4], "--store", store, "--archive", str(archive), *cluster)
    assert status == EXIT_OK and "deleted 1 sessions and 1 archive folders" in out
    assert not (archive / "project-a" / archive_segment(ids[1])).exists()
    assert (archive / "project-a" / archive_segment(ids[0])).exists()
    _, out, _ = _run(capsys, "sessions", "--store", store, "--json")
    assert sorted(json.loads(line)["sessionId"] for line in out.splitlines()) == sorted(ids[:1] + ids[2:])
    _, out, _ = _run(capsys, "findings", "--store", store)
    assert out == ""  # the finding was the deleted session's
    status, out, _ = _run(capsys, "delete-session", "--inactive-for", "1d", "--store", store, *cluster)
    assert status == EXIT_OK and f"deleted {len(ids) - 1} sessions" in out  # every session was active in 1970
    assert _run(capsys, "sessions", "--store", store)[1] == ""


def _last_event(records) -> int:
    """The newest event time of a session's records."""
    return max(found.last for record in records if (found := line_time(record.value)) is not None)


@pytest.mark.kafka
def test_a_backfill_shows_the_logs_own_times_and_retention_deletes_by_them(kafka, topics, tmp_path, capsys):
    """Logs of months ago shipped now: each session reads the times its log
    holds, its ingestion time apart, and --inactive-for deletes by the
    former (by the topic's time, nothing would be older than a minute)."""
    from consumers.projector import Projection, ProjectorConfig
    from tests.policy_driver import KAFKA, Fetched, run_batch
    from tests.view_store_helpers import simulated_fleet
    store, now = str(tmp_path / "views.sqlite"), int(time.time() * 1000)
    fleet = simulated_fleet(6, seed=33)
    rows = [Fetched(r.key, r.value, r.headers, offset, timestamp=now)
            for offset, r in enumerate(r for _, records in fleet for r in records)]
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=store)), rows)
    _, out, _ = _run(capsys, "sessions", "--store", store, "--json")
    listed = {item["sessionId"]: item for item in map(json.loads, out.splitlines())}
    for truth, records in fleet:
        item = listed[truth.session_id]
        assert item["createdAt"] == json.loads(records[0].value)["createdAt"]
        assert item["lastActivity"] == _last_event(records) < now - 30 * 86_400_000
        assert item["ingestedAt"] == now and item["lagMs"] == now - item["lastActivity"]
    times = sorted(_last_event(records) for _, records in fleet)
    age_minutes = (now - (times[2] + times[3]) // 2) // 60_000  # between the third and fourth oldest
    status, out, _ = _run(capsys, "delete-session", "--inactive-for", f"{age_minutes}m", "--store", store,
                          *_cluster(kafka, topics()))
    assert status == EXIT_OK and "deleted 3 sessions" in out
    _, out, _ = _run(capsys, "sessions", "--store", store, "--json")
    assert sorted(json.loads(line)["lastActivity"] for line in out.splitlines()) == times[3:]


def test_findings_follow_prints_each_new_finding_once(tmp_path):
    import subprocess
    import sys
    store = tmp_path / "views.sqlite"
    ids = [truth.session_id for truth, _ in stored_fleet(store)]
    with subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "findings", "--follow", "--json",
                           "--store", str(store)], stdout=subprocess.PIPE, text=True) as follower:
        _follow(follower, store, ids)
    assert follower.returncode is not None


def _line(follower, timeout: float = 30.0) -> str:
    """The follower's next line, within a deadline."""
    import select
    readable, _, _ = select.select([follower.stdout], [], [], timeout)
    assert readable, f"no line from findings --follow in {timeout} s"
    return follower.stdout.readline()


def _follow(follower, store, ids) -> None:
    from consumers.projector import ViewStore
    try:
        assert json.loads(_line(follower))["sessionId"] == ids[1]  # the one there before
        views = ViewStore(store)
        try:
            with views.database.transaction() as db:
                db.execute("INSERT INTO findings (topic, partition, \"offset\", session_id, rule, severity, seq, turn, "
                           "step, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           ("dsh.findings", 1, 3, ids[2], "unlogged-request", "error", 9, 2, 1, "late", 10))
        finally:
            views.close()
        line = _line(follower)  # older than the first, indexed after it: printed all the same
        assert (json.loads(line)["sessionId"], json.loads(line)["detail"]) == (ids[2], "late")
    finally:
        follower.terminate()


#: What a log or an attestation may carry to take over a terminal: a title
#: change, a screen clear, a bell, a bidi override.
_HOSTILE = "\x1b]0;owned\x07\x1b[2J\u202egnp.exe"
_RAW = ("\x1b", "\x07", "\u202e")


def _hostile_store(tmp_path) -> tuple[str, str]:
    """A store whose one session's id, cwd, message text, finding and dead
    letter carry escape sequences (the finding knows no turn or step)."""
    from consumers.projector import Projection, ProjectorConfig, ViewStore
    from dsh_core.session_header import SessionHeader
    from dsh_kafka.records import header_record, records_for_batch
    from tests.policy_driver import KAFKA, fetched, run_batch
    from tests.unit.helpers import new_log, user
    session_id = f"s-{_HOSTILE}"
    log = new_log(session_id)
    log.append("user/message", user("m0", f"hello\n{_HOSTILE}"), surface_op="append")
    header = SessionHeader(id=session_id, createdAt=5, delegationDepth=0, cwd=f"/work/{_HOSTILE}")
    store = tmp_path / "views.sqlite"
    headed = header_record(header)
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=store)),
              fetched([headed, *records_for_batch(session_id, log.events, writer=headed.writer)]))
    views = ViewStore(store)
    try:
        with views.database.transaction() as db:
            db.execute("INSERT INTO findings (topic, partition, \"offset\", session_id, rule, severity, seq, turn, "
                       "step, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       ("dsh.findings", 0, 1, session_id, f"rule-{_HOSTILE}", "error", 1, None, None, _HOSTILE, 50))
            db.execute("INSERT INTO dead_letters (topic, partition, \"offset\", service, reason, detail, source_topic, "
                       "source_partition, source_offset, session_id, seq, at, size, head) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       ("dsh.dead-letter", 0, 1, "projector", "invalid-log", _HOSTILE, "dsh.session-events", 0, 3,
                        session_id, None, 60, 1, b"x"))
    finally:
        views.close()
    return str(store), session_id


def test_readers_show_escape_sequences_visibly_never_raw(tmp_path, capsys):
    store, session_id = _hostile_store(tmp_path)
    shown = "\\x1b]0;owned\\x07\\x1b[2J\\u202egnp.exe"
    for argv in (("sessions",), ("view", "s-"), ("findings",), ("dead-letters",)):
        status, out, err = _run(capsys, *argv, "--store", store)
        assert status == EXIT_OK, (argv, err)
        assert not any(raw in out for raw in _RAW), (argv, out)
        assert shown in out, (argv, out)
    _, out, _ = _run(capsys, "view", "s-", "--store", store)
    assert out.splitlines()[1:] == ["user: hello", f"    {shown}"]  # a newline in a message never starts a `who:`
    _, out, _ = _run(capsys, "findings", "--store", store)
    assert f"session s-{shown} seq 1: {shown}" in out and "None" not in out
    _, out, _ = _run(capsys, "dead-letters", "--store", store)
    assert f"session s-{shown}: {shown}" in out and "None" not in out
    _, out, _ = _run(capsys, "findings", "--store", store, "--json")
    assert json.loads(out)["detail"] == _HOSTILE  # JSON escapes them itself, and keeps them exactly


def test_sessions_has_a_header_row(tmp_path, capsys):
    store = str(tmp_path / "views.sqlite")
    ids = [truth.session_id for truth, _ in stored_fleet(tmp_path / "views.sqlite")]
    _, out, _ = _run(capsys, "sessions", "--store", store)
    header, *rows = out.splitlines()
    assert header.split() == ["SESSION", "STATUS", "LAST", "ACTIVITY", "TURNS", "MSGS", "FINDINGS", "MODELS", "CWD"]
    assert sorted(row.split()[0] for row in rows) == sorted(ids)
    status, turns = header.index("STATUS"), header.index("TURNS") + len("TURNS")
    assert {row[status:].split()[0] for row in rows} == {"idle", "held"}  # each value under its name
    assert all(row[turns - 1].isdigit() and row[turns] == " " for row in rows)


@pytest.mark.kafka
def test_a_deletion_is_a_fence_in_every_service_and_across_restarts(kafka, topics, group_id, tmp_path, capsys):
    """A session deleted while the projector, auditor and archiver run: each
    forgets it, its later records are refused by name (deleted-session) and
    never bring a view or an archive file back, also after a restart."""
    import asyncio

    import sqlite3

    from consumers.archiver import HELD_FILE
    from consumers.archiver.files import archive_segment
    from consumers.projector.outcomes import OutcomeIndex, OutcomeIndexConfig
    from dsh_kafka.admin import end_offsets
    from producers.simulator import SimulatorConfig, simulate_session
    from tests.kafka_fixtures import caught_up, consume_all, publish_records
    from tests.services import archiver, auditor, projector
    from tests.waiting import until
    names = topics(partitions=2)
    config = SimulatorConfig(sessions=2, seed=9, min_turns=3, max_turns=3)
    victim, batches = simulate_session(config, 0)
    records = [record for batch in batches for record in batch]
    late = records[-4:]
    store, archive, group = tmp_path / "views.sqlite", tmp_path / "archive", group_id("fence")
    archive.mkdir()
    cluster = _cluster(kafka, names)

    async def services(step) -> None:
        consumers = [projector(kafka, names, group, store), auditor(kafka, names, f"{group}-auditor",
                                                                    state=tmp_path / "audit.sqlite"),
                     archiver(kafka, names, f"{group}-archiver", archive)]
        index = OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=f"{group}-outcomes", store=store))
        stop = asyncio.Event()
        tasks = [asyncio.create_task(service.run(stop)) for service in (*consumers, index)]

        async def read_to_the_end() -> None:
            ends = await end_offsets(kafka, names.events)
            await until(lambda: any(task.done() for task in tasks) or all(caught_up(c, ends) for c in consumers),
                        90, "every service read the events topic")
        try:
            await step(read_to_the_end, consumers)
        finally:
            stop.set()
            await asyncio.gather(*tasks)  # none stopped on its own: a failure is raised here

    async def live(read_to_the_end, consumers) -> None:
        await publish_records(kafka, names, records[:-4])
        await read_to_the_end()
        assert list(archive.glob(f"*/{archive_segment(victim.session_id)}"))
        deleted = await asyncio.to_thread(main, ["delete-session", victim.session_id, "--store", str(store),
                                                 "--archive", str(archive), *cluster])
        assert deleted == EXIT_OK
        await publish_records(kafka, names, late)  # the agent went on writing
        await read_to_the_end()
        projection, audit, archive_policy = (c.policy for c in consumers)
        assert projection.sessions.get(victim.session_id) is None
        assert audit.sessions.get(victim.session_id).deleted and audit.sessions.get(victim.session_id).fold is None
        assert archive_policy.sessions.get(victim.session_id).deleted

    async def restarted(read_to_the_end, consumers) -> None:
        await publish_records(kafka, names, late)  # shipped again after a restart
        await read_to_the_end()

    asyncio.run(services(live))
    asyncio.run(services(restarted))
    status, _, err = _run(capsys, "view", victim.session_id, "--store", str(store))
    assert status == EXIT_REFUSED and "no session" in err
    assert not list(archive.glob(f"*/{archive_segment(victim.session_id)}"))
    letters = asyncio.run(consume_all(kafka, names.dead_letter, 1, settle=1.0))
    reasons = {dict(letter.headers)["dsh-dlq-reason"] for letter in letters}
    services_refusing = {dict(letter.headers)["dsh-dlq-service"] for letter in letters}
    assert reasons == {b"deleted-session"} and services_refusing == {b"projector", b"auditor", b"archiver"}
    assert all(letter.value == b"" for letter in letters)  # what was erased is not copied
    for state in (tmp_path / "audit.sqlite", archive / HELD_FILE):  # the services' own state keeps only the fence
        with sqlite3.connect(state) as db:
            assert db.execute("SELECT COUNT(*) FROM applied WHERE session_id = ?", (victim.session_id,)).fetchone() \
                == (0,)
    with sqlite3.connect(tmp_path / "audit.sqlite") as db:
        assert db.execute("SELECT fold FROM sessions WHERE session_id = ?", (victim.session_id,)).fetchone() == (None,)
    with sqlite3.connect(archive / HELD_FILE) as db:
        assert db.execute("SELECT session_id FROM deleted_sessions").fetchall() == [(victim.session_id,)]


def test_view_names_a_stored_view_that_does_not_restore(tmp_path, capsys):
    from consumers.projector import ViewStore
    store = tmp_path / "views.sqlite"
    ids = [truth.session_id for truth, _ in stored_fleet(store)]
    views = ViewStore(store)
    try:
        with views.database.transaction() as db:  # what a session written again after its deletion was left with
            db.execute("DELETE FROM surface WHERE session_id = ?", (ids[2],))
    finally:
        views.close()
    status, _, err = _run(capsys, "view", ids[2], "--store", str(store))
    assert status == EXIT_REFUSED and "Traceback" not in err
    assert (f"the stored view does not restore (session {ids[2]!r}: its fold snapshot's surface holds seq " in err
            and "but no surface row of it was given" in err)


@pytest.mark.kafka
def test_delete_session_on_topics_that_are_not_there_deletes_nothing(kafka, topics, tmp_path, capsys):
    store = str(tmp_path / "views.sqlite")
    ids = [truth.session_id for truth, _ in stored_fleet(tmp_path / "views.sqlite")]
    topics()  # the broker is up; the prefix below names no topics
    status, _, err = _run(capsys, "delete-session", ids[0], "--store", store, "--bootstrap", kafka.bootstrap,
                          "--topic-prefix", "nowhere.")
    assert status == EXIT_REFUSED and "no topic nowhere.dsh.session-events on the cluster" in err
    assert _run(capsys, "view", ids[0], "--store", store)[0] == EXIT_OK
