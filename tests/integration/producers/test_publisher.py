"""Publisher against the real broker: order, size limits, failures, metrics."""

from __future__ import annotations

import asyncio
import collections

import pytest
from prometheus_client import REGISTRY

from dsh_kafka.records import KIND_ATTESTATION, KIND_HEADER, decode_kafka_record
from dsh_core.request import build_request, request_digest
from dsh_core.session import SessionLog
from dsh_core.loader import load_session_bytes
from dsh_kafka.errors import DeliveryError, RecordTooLargeError
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session
from tests.kafka_fixtures import consume_all

pytestmark = pytest.mark.kafka


def test_two_hundred_sessions_read_back_in_seq_order(kafka, topics):
    names = topics(partitions=12)
    config = SimulatorConfig(sessions=200, seed=11, max_turns=3)
    sources: dict[str, list[bytes]] = {}

    async def produce() -> int:
        sent = 0
        async with Publisher(kafka, names) as publisher:
            async def one(index: int) -> None:
                nonlocal sent
                truth, batches = simulate_session(config, index)
                for batch in batches:
                    for record in batch:
                        sources.setdefault(record.session_id, []).append(record.value)
                        await publisher.send(record)
                        sent += 1
                    await asyncio.sleep(0)  # wait-ok: a yield so the sessions interleave, not a wait
            await asyncio.gather(*(one(i) for i in range(config.sessions)))
            await publisher.flush()
        return sent

    sent = asyncio.run(produce())
    records = asyncio.run(consume_all(kafka, names.events, sent))
    assert len(records) == sent
    by_session: dict[str, list] = collections.defaultdict(list)
    partitions_of: dict[str, set[int]] = collections.defaultdict(set)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        decoded = decode_kafka_record(record)
        by_session[decoded.session_id].append(decoded)
        partitions_of[decoded.session_id].add(record.partition)
    assert len(by_session) == 200
    assert {len(p) for p in partitions_of.values()} == {1}  # one partition per session
    assert len({p for ps in partitions_of.values() for p in ps}) == 12
    for session_id, received in by_session.items():
        assert [r.value for r in received] == sources[session_id]  # byte-identical, in order
        seqs = [r.seq for r in received if r.kind == "record"]
        assert seqs == sorted(seqs)
        header = received[0]
        assert header.kind == KIND_HEADER
        body = b"".join(r.value + b"\n" for r in received if r.kind == "record")
        assert load_session_bytes(header.value + b"\n" + body).accepted


def test_attestation_digest_and_large_records(kafka, topics):
    names = topics(partitions=2)
    log = SessionLog("big-1")
    log.append("turn/start", {"turn": 1})
    log.append("step/start", {"turn": 1, "step": 1})
    log.append("user/message", {"id": "u", "role": "user", "content": [{"type": "text", "text": "x" * (5 << 20)}],
                                "source": {"kind": "user"}}, surface_op="append")
    log.append("request/header", {"header": {"config": {"provider": "deepseek", "model": "m"}}, "reason": "initial"})
    request = build_request(log.request_header(), log.derive_messages(), "big-1")
    oversized = {"id": "v", "role": "user", "content": [{"type": "text", "text": "y" * (17 << 20)}],
                 "source": {"kind": "user"}}

    async def produce() -> None:
        async with Publisher(kafka, names) as publisher:
            await publisher.publish_header(log.header)
            await publisher.publish_batch("big-1", log.events)
            await publisher.attest_request("big-1", 1, 1, log.seq, request)
            await publisher.flush()
            errors_before = REGISTRY.get_sample_value("dsh_publisher_errors_total", {"error": "RecordTooLargeError"}) or 0
            with pytest.raises(RecordTooLargeError, match=r"session 'big-1' seq 4: a \d+-byte record exceeds the 16777216-byte limit"):
                await publisher.publish_event("big-1", {"type": "user/message", "seq": 4, "time": 1, "data": oversized,
                                                        "surfaceOp": "append"})
            assert REGISTRY.get_sample_value("dsh_publisher_errors_total", {"error": "RecordTooLargeError"}) == errors_before + 1

    asyncio.run(produce())
    records = [decode_kafka_record(r) for r in asyncio.run(consume_all(kafka, names.events, 6))]
    assert [r.kind for r in records] == ["header", "record", "record", "record", "record", "attestation"]
    assert len(records[3].value) > 5 << 20
    attestation = records[-1]
    assert attestation.kind == KIND_ATTESTATION and attestation.seq == 4
    assert request_digest(request) in attestation.value.decode()


def test_delivery_failure_reaches_the_caller(kafka, topics):
    names = topics(partitions=1)

    async def produce() -> None:
        from dsh_kafka.topics import TopicNames
        missing = TopicNames(events=f"{names.events}.does-not-exist")
        from dsh_kafka.config import ProducerSettings
        async with Publisher(kafka, missing, ProducerSettings(request_timeout_ms=3000)) as publisher:
            with pytest.raises(DeliveryError, match=r"session 's' seq 0: record could not be sent to .*does-not-exist"):
                await publisher.publish_event("s", {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}})
                await publisher.flush()

    asyncio.run(produce())
