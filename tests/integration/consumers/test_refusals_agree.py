"""Through the real broker, the three services name a refusal alike: JSON
nested past the depth limit is ``corrupt-storage`` in each (never
``internal``), and a v4 session with another session's events written into
it is a conflicting writer in each, the auditor's finding included."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from consumers.archiver.files import existing_file
from dsh_core.json_depth import MAX_DEPTH
from dsh_core.loader import read_events
from dsh_kafka.clients import make_producer
from dsh_kafka.config import SERVICE_PRODUCER
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import caught_up, consume_all, end_offsets
from tests.services import archiver, auditor, projector

pytestmark = pytest.mark.kafka

SERVICES = ("projector", "auditor", "archiver")


def _sessions(formats: tuple[int, ...], seed: int) -> list[list[SessionRecord]]:
    config = SimulatorConfig(sessions=len(formats), seed=seed, min_turns=2, max_turns=2, big_result_probability=0,
                             formats=formats)
    return [[record for batch in simulate_session(config, index)[1] for record in batch]
            for index in range(config.sessions)]


def _run(kafka, names, group_id, tmp_path, stream: list[SessionRecord]) -> tuple[list, list]:
    """Publish the records, run the three services until they caught up;
    returns the dead letters and the committed findings."""
    async def scenario() -> tuple[list, list]:
        producer = make_producer(kafka, SERVICE_PRODUCER)
        await producer.start()
        try:
            for record in stream:
                await producer.send(names.events, key=record.key, value=record.value, headers=record.headers)
            await producer.flush()
        finally:
            await producer.stop()
        ends = await end_offsets(kafka, names.events)
        services = [projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite"),
                    auditor(kafka, names, group_id("auditor"), state=tmp_path / "auditor.sqlite"),
                    archiver(kafka, names, group_id("archiver"), tmp_path / "archive", v4_copies=True)]
        # run_until fails the test if a service stops before it caught up
        await asyncio.gather(*(run_until(service, lambda s=service: caught_up(s, ends)) for service in services))
        return (await consume_all(kafka, names.dead_letter, 1000, timeout=5),
                await consume_all(kafka, names.findings, 1000, timeout=5, committed_only=True))

    return asyncio.run(scenario())


def _letters(dead: list) -> dict[tuple[str, bytes], list[tuple[int, str, str]]]:
    """(service, key) -> [(offset, reason, error)] of the dead letters."""
    out: dict[tuple[str, bytes], list[tuple[int, str, str]]] = collections.defaultdict(list)
    for record in dead:
        headers = {name: value.decode() for name, value in record.headers}
        out[(headers["dsh-dlq-service"], record.key)].append(
            (int(headers["dsh-dlq-offset"]), headers["dsh-dlq-reason"], headers["dsh-dlq-error"]))
    return out


def _deep(value: bytes, depth: int) -> bytes:
    """The JSON object ``value`` with one more member nested ``depth`` deep as a line counts it."""
    return value[:-1] + b',"deep":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_json_nested_too_deeply_is_corrupt_storage_in_every_service(kafka, topics, group_id, tmp_path):
    names = topics(partitions=1)
    stream, deep_keys = [], set()
    for index, records in enumerate(_sessions((0, 4, 0, 4, 0, 4), seed=23)):
        depth = (MAX_DEPTH + 1, 500, 950)[index // 2]  # 500 and 950 decode, then overran the stack in the fold
        session_id = f"deep-{index}-{records[0].session_id}"
        renamed = [SessionRecord(session_id, r.kind, r.seq, r.count,
                                 r.value.replace(records[0].session_id.encode(), session_id.encode()), r.format_version)
                   for r in records]
        header, first, *rest = renamed
        if index % 3 == 0:  # the header itself nested too deeply: the session never starts
            header = SessionRecord(session_id, KIND_HEADER, 0, 0, _deep(header.value, depth), header.format_version)
        else:
            first = SessionRecord(session_id, first.kind, first.seq, first.count, _deep(first.value, depth),
                                  first.format_version)
        stream += [header, first, *rest]
        deep_keys.add(session_id.encode())

    dead, found = _run(kafka, names, group_id, tmp_path, stream)
    letters = _letters(dead)
    too_deep = f"arrays and objects nested more than {MAX_DEPTH} deep"
    for key in deep_keys:
        for service in ("projector", "archiver"):
            first = letters[(service, key)][0]
            assert first[1] == "corrupt-storage" and too_deep in first[2], (service, key, letters[(service, key)])
    reasons = {reason for items in letters.values() for _, reason, _ in items}
    assert "internal" not in reasons, letters
    refused = {json.loads(r.value)["session"] for r in found if json.loads(r.value)["rule"] == "corrupt-storage"
               and too_deep in json.loads(r.value)["detail"]}
    assert refused == {key.decode() for key in deep_keys}, found  # the auditor reports each, by the same name


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "untagged"])
def test_another_sessions_events_in_a_v4_session_are_a_conflicting_writer_in_every_service(
        kafka, topics, group_id, tmp_path, tagged):
    """A second writer appends three of its own session's events to a v4
    session, numbered on from the first writer's last seq; the first
    writer then writes its own events at those seqs. Tagged with its writer
    (its own header's) or untagged (an older producer, in a session whose
    header record carried its writer), each of its records is refused as a
    conflicting writer by all three services, the auditor reports that
    alone, the first writer's records all apply, and the archive file holds
    the first writer's events only."""
    names = topics(partitions=1)
    session, other, honest = _sessions((4, 4, 4), seed=5)
    victim = session[0].session_id
    cut = len(session) // 2
    next_seq = session[cut].seq
    foreign = []
    for offset, record in enumerate(other[3:6]):
        event = json.loads(record.value) | {"seq": next_seq + offset}
        foreign.append(SessionRecord(victim, record.kind, next_seq + offset, 1, json.dumps(event).encode(), 4,
                                     other[0].writer if tagged else ""))
    stream = honest + session[:cut] + foreign + session[cut:]
    first_foreign = len(honest) + cut

    dead, found = _run(kafka, names, group_id, tmp_path, stream)
    letters = _letters(dead)
    assert not {key for _, key in letters} - {victim.encode()}, letters  # the honest session is untouched
    for service in SERVICES:
        assert [(offset, reason) for offset, reason, _ in letters[(service, victim.encode())]] == [
            (offset, "conflicting-writer") for offset in range(first_foreign, first_foreign + len(foreign))], service
    rules = [(json.loads(r.value)["rule"], json.loads(r.value).get("seq")) for r in found
             if json.loads(r.value)["session"] == victim]
    assert rules == [("conflicting-writer", next_seq)], rules
    _, archived = read_events(existing_file(tmp_path / "archive", victim, "zstd"))
    assert archived == [json.loads(r.value) for r in session if r.kind == KIND_RECORD]
