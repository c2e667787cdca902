"""The negative corpus published as it is: every refused case ends in the
dead-letter topic or in findings with its category; accepted cases project
like their expected files; sessions published alongside are unaffected."""

from __future__ import annotations

import asyncio
import collections
import json
import re

import pytest

from consumers.projector import ViewStore
from dsh_core.errors import DecodeError
from dsh_core.jsonvalue import thaw
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord, record_from_line
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session
from tests.conftest import canonical, corpus_logs, expected_of
from tests.integration.consumers.projector.test_projector import run_until, views_match
from tests.services import auditor, projector
from tests.kafka_fixtures import caught_up, consume_all, end_offsets

pytestmark = pytest.mark.kafka

# In a stream a repeated record is a duplicate, dropped by seq (DESIGN,
# principle 3): the log it leaves is sound, so nothing is refused.
STREAM_EXCEPTIONS = {"seq-duplicate": "a repeated record is deduplicated by seq"}


def renamed_header(line: bytes, session_id: str) -> bytes:
    """The header line naming ``session_id`` (the record key is the identity),
    its other bytes as they are; a header without a string id is left alone."""
    try:
        old = json.loads(line).get("id")
    except (ValueError, AttributeError):
        return line
    if not isinstance(old, str):
        return line
    return re.sub(rb'("id"\s*:\s*)' + re.escape(json.dumps(old).encode()),
                  lambda match: match.group(1) + json.dumps(session_id).encode(), line, count=1)


def records_of(session_id: str, data: bytes) -> list[SessionRecord]:
    """A stored log as records, every complete line as it is (the header
    renamed to the session id the test gives it)."""
    lines = data.split(b"\n")
    complete = lines[:-1]  # a torn last line is never shipped
    out = [SessionRecord(session_id, KIND_HEADER, 0, 0, renamed_header(complete[0], session_id))]
    next_seq = 0
    for line in complete[1:]:
        try:
            record = record_from_line(session_id, line)
            record = SessionRecord(session_id, KIND_RECORD, record.seq, record.count, line)
        except DecodeError:
            record = SessionRecord(session_id, KIND_RECORD, next_seq, 1, line)
        next_seq = record.seq + record.count
        out.append(record)
    return out


def test_negative_corpus_in_the_stream(kafka, topics, group_id, tmp_path):
    names = topics(partitions=4)
    cases = {}
    records = []
    for index, log in enumerate(corpus_logs("dsh-negative")):
        session_id = f"neg-{index:03d}"
        cases[session_id] = (log.stem.split("--")[0], expected_of(log))
        records += records_of(session_id, log.read_bytes())
    bystanders = SimulatorConfig(sessions=5, seed=3)
    truths = []
    for index in range(bystanders.sessions):
        truth, batches = simulate_session(bystanders, index)
        records += [r for batch in batches for r in batch]
        truths.append(truth)
    db = tmp_path / "views.sqlite"

    async def run() -> tuple[list, list]:
        async with Publisher(kafka, names) as publisher:
            await publisher.send_many(records)
            await publisher.flush()
        ends = await end_offsets(kafka, names.events)
        projecting = projector(kafka, names, group_id("projector"), db)
        auditing = auditor(kafka, names, group_id("auditor"))
        await asyncio.gather(run_until(projecting, lambda: caught_up(projecting, ends)),
                             run_until(auditing, lambda: caught_up(auditing, ends)))
        dead = await consume_all(kafka, names.dead_letter, 10_000, timeout=3)
        found = await consume_all(kafka, names.findings, 10_000, timeout=3, committed_only=True)
        return dead, found

    dead, found = asyncio.run(run())
    categories = collections.defaultdict(set)
    for record in dead:
        headers = dict(record.headers)
        categories[record.key.decode()].add(headers["dsh-dlq-reason"].decode())
    for record in found:
        finding = json.loads(record.value)
        categories[finding["session"]].add(finding["category"])
    assert views_match(db, truths), "the sessions published alongside were affected"
    store = ViewStore(db)
    try:
        for session_id, (mutation, expected) in sorted(cases.items()):
            if not expected["accepted"]:
                if mutation in STREAM_EXCEPTIONS:
                    continue
                assert expected["error"]["category"] in categories[session_id], (mutation, categories[session_id])
            elif expected["repair"] is None:
                messages = thaw(store.fold(session_id).state.messages())
                assert canonical(messages) == canonical(expected["derivedMessages"]), mutation
                assert not categories[session_id] - {"reconstruction", "invariant"}, (mutation, categories[session_id])
    finally:
        store.close()
