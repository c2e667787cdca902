"""Hostile records between honest sessions on one partition, through the
real broker: no service stops, every honest session is projected and
archived exactly, every hostile record is dead-lettered or reported with
its reason, and nothing is written outside the archive root."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import shutil

import pytest

from dsh_core.storage.layout import find_session_files
from consumers.projector.store_reader import StoreReader
from dsh_core.loader import load_session
from dsh_core.jsonvalue import encode_json
from dsh_kafka.clients import make_producer
from dsh_kafka.config import SERVICE_PRODUCER
from dsh_kafka.records import KIND_HEADER, SessionRecord
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.consumers.archiver.test_archiver import assert_archive_is_the_truth
from tests.integration.consumers.projector.test_projector import run_until, views_match
from tests.kafka_fixtures import caught_up, consume_all, end_offsets
from tests.services import archiver, auditor, projector

pytestmark = pytest.mark.kafka

Raw = tuple[bytes, bytes, list[tuple[str, bytes]]]


def _raw(record: SessionRecord) -> Raw:
    return record.key, record.value, record.headers


def _headers(kind: str, seq: object, count: object) -> list[tuple[str, bytes]]:
    return [("dsh-kind", kind.encode()), ("dsh-seq", str(seq).encode()), ("dsh-count", str(count).encode()),
            ("dsh-format", b"0")]


def _records_of(config: SimulatorConfig, index: int) -> list[Raw]:
    _, batches = simulate_session(config, index)
    return [_raw(record) for batch in batches for record in batch]


def test_hostile_records_are_contained(kafka, topics, group_id, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="dsh")
    names = topics(partitions=1)
    config = SimulatorConfig(sessions=3, seed=91, min_turns=2, max_turns=3)
    truths, honest = [], []
    for index in range(config.sessions):
        truth, batches = simulate_session(config, index)
        truths.append(truth)
        honest.append([r for batch in batches for r in batch])
    victim, liar, shared = truths[0].session_id, truths[1].session_id, truths[2].session_id
    forged = json.loads(honest[0][0].value) | {"id": "someone-else"}
    # a session whose token counts are past the store's 64-bit columns; one whose texts no store text holds
    overflow, unusual = (_records_of(config, index) for index in (3, 4))
    overflow = [(key, value.replace(b'"inputTokens":', b'"inputTokens":1' + b"0" * 30), headers)
                for key, value, headers in overflow]
    text = "\ud800 nul\x00 \udfff\U0010ffff0; "
    unusual = [(key, value.replace(b'"type":"text","text":"', b'"type":"text","text":"' + encode_json(text)[1:-1]),
                headers) for key, value, headers in unusual]
    header = json.loads(honest[0][0].value)
    seq_zero = next(r for r in honest[1] if r.kind != KIND_HEADER and r.seq == 0)
    seq_two = next(r for r in honest[2] if r.kind != KIND_HEADER and r.seq == 2)
    # (key, value, headers) -> what each service does with it
    hostile: list[tuple[Raw, dict[str, set[str]]]] = [
        ((victim.encode(), json.dumps(forged).encode(), _headers("header", 0, 0)),
         {"projector": {"identity"}, "auditor": {"identity"}, "archiver": {"identity"}}),
        ((b"hostile-seq", b"{}", _headers("record", 2**63, 1)),
         {name: {"corrupt-storage"} for name in ("projector", "auditor", "archiver")}),
        ((b"hostile-json", b"{not json", _headers("header", 0, 0)),
         {"projector": {"corrupt-storage"}, "archiver": {"corrupt-storage"}}),  # the auditor reports it (a finding)
        ((b"hostile-deep", b"[" * 100_000 + b"]" * 100_000, _headers("header", 0, 0)),
         {"projector": {"corrupt-storage"}, "archiver": {"corrupt-storage"}}),  # the auditor reports it
        ((b"hostile-surrogate", b'{"type": "\\ud800", "seq": 0}', _headers("record", 0, 1)),
         {}),  # held: the session never gets a header
        # a key that is no session id: PostgreSQL's text and file names hold no NUL
        ((b"hostile\x00nul", json.dumps(header | {"id": "hostile\x00nul"}).encode(), _headers("header", 0, 0)),
         {name: {"invalid-session-id"} for name in ("projector", "auditor", "archiver")}),
        # a null header value, copied into the record's dead letter as it is
        ((b"hostile-null", b"{}", _headers("record", 0, 1)[:2] + [("dsh-count", None), ("dsh-format", b"0")]),
         {name: {"corrupt-storage"} for name in ("projector", "auditor", "archiver")}),
        # header fields the stores keep as columns, of a type dsh never gives them
        *(((key, json.dumps(header | {"id": key.decode(), "cwd": cwd}).encode(), _headers("header", 0, 0)),
           {name: {"invalid-log"} for name in ("projector", "auditor", "archiver")})
          for key, cwd in ((b"hostile-cwd-number", 10**30), (b"hostile-cwd-list", ["/"]))),
        (overflow[0], {"projector": {"unstorable"}}),  # its token counts: the projector's store takes no such number
        # a second writer of a session naming its writer: other bytes at a seq it wrote
        ((shared.encode(), seq_two.value.replace(b"{", b"{ ", 1),
          _headers("record", 2, 1) + [("dsh-writer", seq_two.writer.encode())]),
         {name: {"conflicting-writer"} for name in ("projector", "auditor", "archiver")}),
        ((liar.encode(), seq_zero.value, _headers("record", 0, 10**9) + [("dsh-writer", seq_zero.writer.encode())]),
         {"archiver": {"corrupt-storage"}}),
    ]
    # the liar's record right after its header, the second writer's at the end, the rest before the honest sessions
    stream = [raw for raw, _ in hostile[:-2]] + overflow[1:] + unusual
    for index, records in enumerate(honest):
        stream += [_raw(records[0])] + ([hostile[-1][0]] if index == 1 else []) + [_raw(r) for r in records[1:]]
    stream.append(hostile[-2][0])
    db, state, root = tmp_path / "views.sqlite", tmp_path / "auditor.sqlite", tmp_path / "archive"

    async def scenario() -> tuple[list, list]:
        producer = make_producer(kafka, SERVICE_PRODUCER)
        await producer.start()
        try:
            for key, value, headers in stream:
                await producer.send(names.events, key=key, value=value, headers=headers)
            await producer.flush()
        finally:
            await producer.stop()
        ends = await end_offsets(kafka, names.events)
        services = [projector(kafka, names, group_id("projector"), db), auditor(kafka, names, group_id("auditor"),
                                                                                   state=state),
                    archiver(kafka, names, group_id("archiver"), root)]
        # run_until fails the test if a service stops before it caught up
        await asyncio.gather(*(run_until(service, lambda s=service: caught_up(s, ends)) for service in services))
        dead = await consume_all(kafka, names.dead_letter, 1000, timeout=5)
        found = await consume_all(kafka, names.findings, 1000, timeout=5, committed_only=True)
        return dead, found

    dead, found = asyncio.run(scenario())
    reasons: dict[tuple[str, bytes], set[str]] = collections.defaultdict(set)
    for record in dead:
        headers = dict(record.headers)
        reasons[(headers["dsh-dlq-service"].decode(), record.key)].add(headers["dsh-dlq-reason"].decode())
    for (key, _, _), expected in hostile:
        for service, allowed in expected.items():
            assert reasons.pop((service, key), set()) & allowed, (service, key, allowed)
    assert not reasons, f"dead letters nobody expected: {dict(reasons)}"
    rules = {(json.loads(r.value)["session"], json.loads(r.value)["rule"]) for r in found}
    assert {("hostile-json", "corrupt-storage"), ("hostile-deep", "corrupt-storage")} <= rules
    rules.remove((shared, "conflicting-writer"))
    assert not {session for session, _ in rules} & {t.session_id for t in truths}, rules  # honest: clean

    said = {(record.name, record.levelname, record.getMessage().split(";")[0].split(" partitions")[0])
            for record in caplog.records}
    for service in ("projector", "auditor", "archiver"):  # the services' own lines, one per reason and batch
        assert {(f"dsh.{service}", "INFO", "assigned"), (f"dsh.{service}", "WARNING", "dead-lettered 1 record(s), "
                 "reason identity"), (f"dsh.{service}", "INFO", "stopped: everything handled is persisted and "
                 "committed")} <= said, sorted(said)
    assert views_match(db, truths)
    reader = StoreReader(db)
    try:
        view = reader.session(unusual[0][0].decode())
        assert view["status"] == "idle" and view["messages"]
        assert all(block["text"].startswith(text) for message in view["messages"] if message["role"] == "user"
                   for block in message["content"] if block["type"] == "text")
        assert reader.session(overflow[0][0].decode())["status"] == "refused"
    finally:
        reader.close()
    beside = {path.parent.name: path for path in find_session_files(root)
              if path.parent.name in (overflow[0][0].decode(), unusual[0][0].decode())}
    assert len(beside) == 2 and all(load_session(path).accepted for path in beside.values())
    for path in beside.values():  # not among the truths
        shutil.rmtree(path.parent)
    assert_archive_is_the_truth(root, truths)
    written = {path.relative_to(tmp_path).parts[0] for path in tmp_path.rglob("*")}
    assert written <= {"views.sqlite", "views.sqlite-wal", "views.sqlite-shm", "auditor.sqlite", "auditor.sqlite-wal",
                       "auditor.sqlite-shm", "archive"}, written
