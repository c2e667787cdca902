"""Through the real broker: two logs of one session id shipped from two
roots. The second writer is kept out of everything (each of its records a
``conflicting-writer`` dead letter in every service, one finding), the
session is ``conflicted`` in its view and listing, the first writer's later
records still flow, and the archive file is the first writer's log byte
for byte. The same log published by a bridge (event by event) and by the
shipper (packed rows) is one writer: nothing is refused or reported."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import pytest

from consumers.archiver.files import existing_file
from consumers.projector import ViewStore
from consumers.projector.reader import SessionFilter
from consumers.projector.store_reader import StoreReader
from dsh_core.loader import read_events
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord
from producers.publisher import Publisher
from dsh_kafka.admin import cluster_id
from producers.shipper import Destination, Shipper, ShipperConfig
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.consumers.projector.test_projector import run_until
from tests.kafka_fixtures import caught_up, consume_all, end_offsets
from tests.layout_helpers import place
from tests.services import archiver, auditor, projector
from tests.writers import second_writer

pytestmark = pytest.mark.kafka


def _simulated(seed: int):
    truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=seed, min_turns=3, max_turns=4,
                                                      big_result_probability=0), 0)
    return truth, [r for batch in batches for r in batch if r.kind in (KIND_HEADER, KIND_RECORD)]


def _log(records: list[SessionRecord]) -> bytes:
    return b"".join(record.value + b"\n" for record in records)


async def _ship(publisher: Publisher, root: Path, state: Path) -> None:
    destination = Destination(await cluster_id(publisher.kafka), publisher.topics.events)
    await Shipper(ShipperConfig(root, state, once=True), publisher.send, publisher.flush, report=pytest.fail,
                  say=print, destination=destination).run(asyncio.Event())


async def _consume(kafka, names, group_id, tmp_path) -> tuple[list, list]:
    """Run the three services until they caught up; the dead letters and
    the committed findings."""
    ends = await end_offsets(kafka, names.events)
    services = [projector(kafka, names, group_id("projector"), tmp_path / "views.sqlite"),
                auditor(kafka, names, group_id("auditor"), state=tmp_path / "auditor.sqlite"),
                archiver(kafka, names, group_id("archiver"), tmp_path / "archive", compression="none")]
    await asyncio.gather(*(run_until(service, lambda s=service: caught_up(s, ends)) for service in services))
    return (await consume_all(kafka, names.dead_letter, 10_000, timeout=3),
            await consume_all(kafka, names.findings, 10_000, timeout=3, committed_only=True))


def _view(tmp_path: Path, session_id: str) -> tuple[str, int, str]:
    store = ViewStore(tmp_path / "views.sqlite")
    try:
        view = store.view(session_id)
    finally:
        store.close()
    return view["status"], view["nextSeq"], view["messagesDigest"]


def test_a_second_writer_from_another_root_is_kept_out_and_the_first_keeps_flowing(kafka, topics, group_id,
                                                                                   tmp_path):
    names = topics(partitions=2)
    truth, first = _simulated(seed=71)
    _, other = _simulated(seed=72)
    second = second_writer(first, other)
    cut = len(first) // 2
    assert len(second) > cut + 3  # its seqs overlap the first writer's and go past them
    one, two = tmp_path / "root-one", tmp_path / "root-two"
    path = place(one, _log(first[:cut]), "none")
    place(two, _log(second), "none")

    async def scenario() -> tuple[list, list]:
        async with Publisher(kafka, names) as publisher:
            await _ship(publisher, one, tmp_path / "state-one")
            await _ship(publisher, two, tmp_path / "state-two")
            with open(path, "ab") as log:  # the first writer goes on
                log.write(_log(first[cut:]))
            await _ship(publisher, one, tmp_path / "state-one")
        return await _consume(kafka, names, group_id, tmp_path)

    dead, found = asyncio.run(scenario())
    letters = collections.Counter((dict(r.headers)["dsh-dlq-service"], dict(r.headers)["dsh-dlq-reason"], r.key)
                                  for r in dead)
    key = truth.session_id.encode()
    assert letters == {(service, b"conflicting-writer", key): len(second)
                       for service in (b"projector", b"auditor", b"archiver")}, letters
    rules = [(json.loads(r.value)["rule"], json.loads(r.value)["session"]) for r in found]
    assert rules == [("conflicting-writer", truth.session_id)], rules

    assert _view(tmp_path, truth.session_id) == ("conflicted", truth.next_seq, truth.messages_digest)
    reader = StoreReader(tmp_path / "views.sqlite")  # what the API, the viewer and `sessions` read
    try:
        assert reader.session(truth.session_id)["status"] == "conflicted"
        listed = reader.sessions(SessionFilter(status=("conflicted",)))["items"]
        assert [item["sessionId"] for item in listed] == [truth.session_id]
    finally:
        reader.close()
    archived = existing_file(tmp_path / "archive", truth.session_id, "none")
    assert archived.read_bytes() == path.read_bytes() == _log(first)


def test_the_same_log_from_a_bridge_and_the_shipper_is_one_writer(kafka, topics, group_id, tmp_path):
    names = topics(partitions=1)
    truth, first = _simulated(seed=73)
    root = tmp_path / "root"
    path = place(root, _log(first), "none")
    header, events = read_events(path)

    async def scenario() -> tuple[list, list]:
        async with Publisher(kafka, names) as publisher:
            await publisher.publish_header(header)  # as a bridge does: the header, then event by event
            for event in events:
                await publisher.publish_event(truth.session_id, event)
            await publisher.flush()
            await _ship(publisher, root, tmp_path / "state")
        published = await consume_all(kafka, names.events, 10_000, timeout=3)
        return published, *await _consume(kafka, names, group_id, tmp_path)

    published, dead, found = asyncio.run(scenario())
    writers = collections.Counter(dict(r.headers).get("dsh-writer") for r in published)
    assert list(writers) == [first[0].writer.encode()] and writers.total() > len(first), writers  # both, one writer
    assert (dead, found) == ([], [])
    assert _view(tmp_path, truth.session_id) == ("idle", truth.next_seq, truth.messages_digest)


def test_a_second_writers_records_before_any_header_are_never_merged_with_the_header_that_comes_next(
        kafka, topics, group_id, tmp_path):
    """Records naming writer B reach the topic before any header, then a
    whole log of writer A, then B's header and the rest of B's log. B's
    records named the session's writer first: every record of A is a
    ``conflicting-writer`` letter in each service, one finding, and the
    view and the archive file are B's log alone, never a mix."""
    names = topics(partitions=1)
    _, first = _simulated(seed=74)
    truth, other = _simulated(seed=75)
    second = second_writer(first, other)
    early = second[1:5]  # before their own header
    stream = early + first + second[:1] + second[5:]

    async def scenario() -> tuple[list, list]:
        async with Publisher(kafka, names) as publisher:
            await publisher.send_many(stream)
            await publisher.flush()
        return await _consume(kafka, names, group_id, tmp_path)

    dead, found = asyncio.run(scenario())
    session_id = first[0].session_id
    letters = collections.Counter((dict(r.headers)["dsh-dlq-service"], dict(r.headers)["dsh-dlq-reason"],
                                   int(dict(r.headers)["dsh-dlq-offset"])) for r in dead)
    assert letters == {(service, b"conflicting-writer", offset): 1 for service in (b"projector", b"auditor", b"archiver")
                       for offset in range(len(early), len(early) + len(first))}, letters
    rules = [json.loads(r.value)["rule"] for r in found if json.loads(r.value)["session"] == session_id]
    assert rules.count("conflicting-writer") == 1 and set(rules) <= {"conflicting-writer", "sequence-gap"}, rules
    assert _view(tmp_path, session_id)[1:] == (truth.next_seq, truth.messages_digest)
    archived = existing_file(tmp_path / "archive", session_id, "none")
    assert archived.read_bytes() == _log([r for r in second if r.kind in (KIND_HEADER, KIND_RECORD)])
