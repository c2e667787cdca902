"""Findings and dead letters indexed into the view store from their topics,
on the real broker and on both store backends: every committed record once,
an aborted finding never, and a restart that lost the group's offsets
resumes from the store's without a duplicate."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from consumers.projector.outcomes import OutcomeIndex, OutcomeIndexConfig
from consumers.projector.reader import DeadLetterFilter, FindingFilter
from consumers.projector.store import ViewStore
from consumers.projector.store_reader import StoreReader
from consumers.runtime import ServiceState
from dsh_core.jsonvalue import encode_json
from dsh_kafka.clients import make_producer
from dsh_pipeline.ops_server import consumers_health
from tests import postgres_fixture
from tests.waiting import until

pytestmark = pytest.mark.kafka
postgres_dsn, store_location = postgres_fixture.postgres_dsn, postgres_fixture.store_location


def _finding(session: str, seq: int) -> bytes:
    return json.dumps({"rule": "request-mismatch", "category": "reconstruction", "severity": "error",
                       "session": session, "seq": seq, "turn": 1, "step": 1, "detail": f"at {seq}"}).encode()


async def _publish(kafka, names, first: int, count: int, aborted: bool = False) -> None:
    producer = make_producer(kafka, transactional_id=f"test-outcomes-{names.findings}-{first}")
    await producer.start()
    try:
        async with producer.transaction():
            for n in range(first, first + count):
                await producer.send(names.findings, _finding(f"s-{n % 3}", n), key=f"s-{n % 3}".encode())
                await producer.send(names.dead_letter, b'{"seq": "broken"}' * 40, key=f"s-{n % 3}".encode(),
                                    headers=[("dsh-seq", str(n).encode()), ("dsh-dlq-service", b"projector"),
                                             ("dsh-dlq-reason", b"corrupt-storage"),
                                             ("dsh-dlq-error", b"DecodeError: not an event"),
                                             ("dsh-dlq-topic", names.events.encode()),
                                             ("dsh-dlq-partition", b"0"), ("dsh-dlq-offset", str(n).encode())])
            if aborted:
                raise _Abort
    except _Abort:
        pass
    finally:
        await producer.stop()


class _Abort(Exception):
    pass


def _counts(location) -> tuple[int, int]:
    store = ViewStore(location)
    try:
        return (store.db.execute("SELECT COUNT(*) FROM findings").fetchone()[0],
                store.db.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0])
    finally:
        store.close()


async def _index_until(kafka, names, group: str, location, expected: tuple[int, int]) -> None:
    index = OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=group, store=location))
    stop = asyncio.Event()
    task = asyncio.create_task(index.run(stop))
    try:
        await until(lambda: task.done() or _counts(location) == expected, 60, f"{expected} rows indexed")
    finally:
        stop.set()
        await task


def test_every_committed_outcome_is_indexed_once(kafka, topics, group_id, store_location):
    names = topics(partitions=3)
    ViewStore(store_location).close()

    async def scenario() -> None:
        await _publish(kafka, names, 0, 12)
        await _publish(kafka, names, 100, 5, aborted=True)
        await _index_until(kafka, names, group_id("outcomes"), store_location, (12, 12))
        await _publish(kafka, names, 12, 6)
        # a new group: no group offsets at all; reading resumes from the store's
        await _index_until(kafka, names, group_id("outcomes"), store_location, (18, 18))

    asyncio.run(scenario())
    assert _counts(store_location) == (18, 18)
    reader = StoreReader(store_location)
    try:
        findings = reader.findings(FindingFilter(session_id="s-1"), limit=100)["items"]
        assert sorted(item["seq"] for item in findings) == [n for n in range(18) if n % 3 == 1]
        assert all(item["rule"] == "request-mismatch" and item["detail"] == f"at {item['seq']}" for item in findings)
        letters = reader.dead_letters(DeadLetterFilter(reason="corrupt-storage"), limit=100)["items"]
        assert len(letters) == 18 and {letter["service"] for letter in letters} == {"projector"}
        one = reader.dead_letter(letters[0]["id"])
        assert one["size"] == 17 * 40 and one["head"] == ('{"seq": "broken"}' * 40)[:256]
        assert (one["topic"], one["partition"], one["offset"]) == (names.events, 0, one["seq"])
    finally:
        reader.close()


def test_outcomes_no_store_text_or_column_holds_are_indexed_exactly(kafka, topics, group_id, store_location):
    """A finding whose detail holds a lone surrogate and NUL, a dead letter
    with numbers of thousands of digits (past what Python's int() parses)
    and null headers: each indexed (the texts exactly), none stops it."""
    names = topics(partitions=1)
    ViewStore(store_location).close()
    detail = "a \ud800 lone \x00 surrogate \U0010ffff"
    digits = ("9" * 5000).encode()

    async def scenario() -> None:
        producer = make_producer(kafka, transactional_id=f"test-outcomes-{names.findings}")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send(names.findings, encode_json({"rule": "invariant", "severity": "error",
                                                                 "session": "s-\udfff", "seq": 3, "detail": detail}),
                                    key="s-\udfff".encode("utf-8", "surrogatepass"))
                await producer.send(names.dead_letter, b"{}", key=b"s-\x00", headers=[
                    ("dsh-seq", digits), ("dsh-dlq-offset", b"-" + digits), ("dsh-dlq-value-size", digits),
                    ("dsh-dlq-service", b"auditor"), ("dsh-dlq-reason", None), ("dsh-count", None)])
        finally:
            await producer.stop()
        await _index_until(kafka, names, group_id("outcomes"), store_location, (1, 1))

    asyncio.run(scenario())
    reader = StoreReader(store_location)
    try:
        [finding] = reader.findings(FindingFilter(session_id="s-\udfff"))["items"]
        assert (finding["detail"], finding["seq"]) == (detail, 3)
        [letter] = reader.dead_letters(DeadLetterFilter(session_id="s-\x00"))["items"]
        assert (letter["service"], letter["reason"], letter["offset"], letter["seq"], letter["size"]) == (
            "auditor", "unknown", None, None, 2)
    finally:
        reader.close()


def test_a_failed_resume_on_assignment_stops_the_index_and_it_says_so(kafka, topics, group_id, tmp_path,
                                                                     monkeypatch):
    """The index is a member of the consumer runtime: a rebalance step that
    fails (here the store cannot say where to resume) stops it with that
    error (aiokafka alone would log it and read on from the group's
    offsets), and its state, read by /healthz, says it failed."""
    names = topics(partitions=1)

    def unreadable(store):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(ViewStore, "outcome_offsets", unreadable)
    index = OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=group_id("outcomes"),
                                            store=tmp_path / "views.sqlite"))
    check = consumers_health({index.name: index})
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        asyncio.run(asyncio.wait_for(index.run(asyncio.Event()), 60))
    assert index.state is ServiceState.FAILED
    assert check() == (False, "projector-outcomes: failed, not running")
