"""export-otel end to end: a real session through the broker to Jaeger,
the exporter killed between two steps of the session and started again.
Jaeger is read without its query adjusters, so a span sent twice would
show twice."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest

from consumers.otel import GenAISpan, SpanMapper
from consumers.otel.spans import trace_id
from tests.conftest import ROOT
from tests.integration.consumers.test_bad_input import records_of
from tests.jaeger import running_jaeger
from tests.kafka_fixtures import group_lag, publish_records
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

LOG = ROOT / "tests/corpus/dsh-real/apps-web-tests-snapshots-cordis-tool-round.jsonl"


def _id(value: str) -> int:
    """An OTLP JSON span or trace id (hex, as OTLP/JSON writes it; base64 as protobuf's JSON does)."""
    if value and all(c in "0123456789abcdefABCDEF" for c in value) and len(value) in (16, 32):
        return int(value, 16)
    return int.from_bytes(base64.b64decode(value), "big") if value else 0


def _value(value: dict[str, Any]) -> Any:
    (kind, inner), = value.items()
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [_value(item) for item in inner.get("values", [])]
    return inner


def _received(span: dict[str, Any]) -> tuple[Any, ...]:
    attributes = {item["key"]: _value(item["value"]) for item in span.get("attributes", [])}
    return (span["name"], _id(span["spanId"]), _id(span.get("parentSpanId", "")) or None,
            int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"]), attributes)


def _expected(span: GenAISpan) -> tuple[Any, ...]:
    attributes = dict(span.attributes)
    if span.error is not None:
        attributes["error.type"] = span.error
    return (span.name, span.span_id, span.parent_id, span.start_ms * 1_000_000, span.end_ms * 1_000_000, attributes)


def test_spans_arrive_nested_with_their_attributes_once_each_across_a_kill_between_steps(kafka, topics, group_id,
                                                                                          tmp_path):
    names = topics(partitions=2)
    session_id = f"otel-{uuid.uuid4().hex[:12]}"
    records = records_of(session_id, LOG.read_bytes())
    mapper = SpanMapper(session_id, content=True)
    expected = [_expected(span) for record in records[1:] for span in mapper.feed(record.value)]
    # between steps: after the second step/end of the session
    step_ends = [index for index, record in enumerate(records) if b'"type":"step/end"' in record.value]
    cut = step_ends[1] + 1
    before = SpanMapper(session_id, content=True)
    expected_before = [span for record in records[1:cut] for span in before.feed(record.value)]
    assert 0 < len(expected_before) < len(expected)
    group = group_id("otel")
    prefix = names.events[: -len("dsh.session-events")]
    with running_jaeger(tmp_path) as jaeger:
        command = [sys.executable, "-m", "dsh_pipeline.cli", "export-otel", "--state", str(tmp_path / "otel.sqlite"),
                   "--otlp-endpoint", jaeger.traces_url, "--content", "--group", group, "--bootstrap",
                   kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "2", "--max-records", "3"]
        trace = trace_id(session_id)

        def run_until_caught_up(then: signal.Signals) -> None:
            with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as child:
                try:
                    wait_for(lambda: child.poll() is not None or asyncio.run(group_lag(kafka, names.events, group)) == 0,
                             120, "the exporter to commit every record")
                    assert child.poll() is None, child.stderr.read().decode()[-3000:]
                finally:
                    os.kill(child.pid, then)
                    child.wait(60)

        asyncio.run(publish_records(kafka, names, records[:cut]))
        run_until_caught_up(signal.SIGKILL)
        assert len(jaeger.spans(trace)) == len(expected_before)
        asyncio.run(publish_records(kafka, names, records[cut:]))
        run_until_caught_up(signal.SIGTERM)
        received = [_received(span) for span in jaeger.spans(trace)]
    ids = collections.Counter(span[1] for span in received)
    assert [span_id for span_id, count in ids.items() if count > 1] == [], "spans received twice"
    assert sorted(received, key=lambda span: span[1]) == sorted(expected, key=lambda span: span[1])
    by_name = collections.Counter(span[0].split()[0] for span in received)
    assert by_name == {"chat": 4, "execute_tool": 3, "invoke_agent": 1}
    turn = next(span for span in received if span[0] == "invoke_agent dsh")
    assert all(span[2] == turn[1] for span in received if span is not turn)
    first_chat = min((span for span in received if span[0].startswith("chat")), key=lambda span: span[3])
    assert first_chat[5]["gen_ai.provider.name"] == "deepseek"
    assert first_chat[5]["session.id"] == first_chat[5]["gen_ai.conversation.id"] == session_id
    assert json.loads(first_chat[5]["gen_ai.output.messages"])[0]["role"] == "assistant"


def test_a_second_member_joining_and_the_first_leaving_move_sessions_without_a_span_lost_or_repeated(
        kafka, topics, group_id, tmp_path):
    """Two members of one group on one host share the state file: each
    rebalance hands sessions over mid-way, and the member taking one on goes
    on from the state the other wrote at its last checkpoint."""
    names = topics(partitions=4)
    sessions = [f"otel-{uuid.uuid4().hex[:12]}" for _ in range(8)]
    records, expected = [], {}
    for session_id in sessions:
        own = records_of(session_id, LOG.read_bytes())
        mapper = SpanMapper(session_id, content=False)
        expected[session_id] = sorted((_expected(span) for record in own[1:] for span in mapper.feed(record.value)),
                                      key=lambda span: span[1])
        records += own
    asyncio.run(publish_records(kafka, names, records))
    group = group_id("otel")
    prefix = names.events[: -len("dsh.session-events")]
    with running_jaeger(tmp_path) as jaeger:
        command = [sys.executable, "-m", "dsh_pipeline.cli", "export-otel", "--state", str(tmp_path / "otel.sqlite"),
                   "--otlp-endpoint", jaeger.traces_url, "--group", group, "--bootstrap", kafka.bootstrap,
                   "--topic-prefix", prefix, "--partitions", "4", "--max-records", "2"]
        total = len(records)

        def lag() -> int:
            return asyncio.run(group_lag(kafka, names.events, group))

        with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as first:
            try:
                wait_for(lambda: first.poll() is not None or lag() < total - 20, 120, "the first member's commits")
                with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as second:
                    try:
                        wait_for(lambda: second.poll() is not None or lag() < total * 2 // 3, 120, "both at work")
                        first.send_signal(signal.SIGTERM)  # leaves the group: the second takes every partition
                        assert first.wait(60) == 0
                        wait_for(lambda: second.poll() is not None or lag() == 0, 180, "the second to finish")
                        assert second.poll() is None
                    finally:
                        second.send_signal(signal.SIGTERM)
                        second.wait(60)
            finally:
                if first.poll() is None:
                    first.kill()
                first.wait(60)
        received = {session_id: sorted((_received(span) for span in jaeger.spans(trace_id(session_id))),
                                       key=lambda span: span[1]) for session_id in sessions}
    assert received == expected
