"""The exporter's policy without a broker or a receiver: batches handled
the way the runtime handles them (the next one while the last one's spans
are being sent), sessions evicted from memory meanwhile, a restart on the
same state file, and a receiver that refuses a batch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from consumers.otel import GenAISpan, OtelExportConfig, SpanMapper
from consumers.otel.otlp import ExportError
from consumers.otel.service import OtelExport, OtelOutputs
from consumers.runtime import ConsumerService
from consumers.otel.config import OtlpSettings
from tests.conftest import ROOT
from tests.integration.consumers.test_bad_input import records_of
from tests.policy_driver import KAFKA, NAMES, fetched

LOG = ROOT / "tests/corpus/dsh-real/apps-web-tests-snapshots-cordis-tool-round.jsonl"


class _Producer:
    async def flush(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class _Receiver:
    def __init__(self, refuse: int | None = None) -> None:
        self.spans: list[GenAISpan] = []
        self.calls = 0
        self.refuse = refuse  # the call (0-based) that fails

    def send(self, spans: list[GenAISpan]) -> None:
        self.calls += 1
        if self.calls - 1 == self.refuse:
            raise ExportError("the receiver refused")
        self.spans += spans

    def close(self) -> None:
        pass


class _Outputs(OtelOutputs):
    def __init__(self, receiver: _Receiver) -> None:
        super().__init__(KAFKA, NAMES, "test", OtlpSettings())
        self.receiver = receiver

    async def start(self, consumer) -> None:
        self.sender, self.producer = self.receiver, _Producer()

    async def commit(self, offsets) -> bool:
        return True


def _interleaved() -> tuple[list, dict[str, list[GenAISpan]]]:
    """Two sessions of the tool round, record by record in turns."""
    sessions = {name: records_of(name, LOG.read_bytes()) for name in ("otel-a", "otel-b")}
    expected = {}
    for name, records in sessions.items():
        mapper = SpanMapper(name)
        expected[name] = [span for record in records[1:] for span in mapper.feed(record.value)]
    records = [record for pair in zip(*sessions.values()) for record in pair]
    return records, expected


def _run(state: Path, receiver: _Receiver, batches: list[list]) -> None:
    """Each batch handled while the previous one's checkpoint is flushed, as the runtime does."""
    config = OtelExportConfig(kafka=KAFKA, group="g", state=state, hot_sessions=1)
    policy = OtelExport(config)
    outputs = _Outputs(receiver)
    service = ConsumerService(config, policy, outputs)
    partition = TopicPartition(NAMES.events, 0)

    async def run() -> None:
        await outputs.start(None)
        await policy.open(outputs)
        try:
            flushing = None
            for batch in batches:
                service.handle_batch({partition: batch})
                if flushing is not None:
                    await flushing
                policy.persist()
                flushing = asyncio.create_task(outputs.flush())
            if flushing is not None:
                await flushing
        finally:
            await policy.close(False)

    asyncio.run(run())


def _batches(records: list, size: int, first_offset: int = 0) -> list[list]:
    rows = fetched(records)
    for row in rows:
        row.offset += first_offset
    return [rows[start:start + size] for start in range(0, len(rows), size)]


def test_every_span_is_sent_once_while_sessions_leave_memory_between_batches(tmp_path):
    records, expected = _interleaved()
    receiver = _Receiver()
    _run(tmp_path / "otel.sqlite", receiver, _batches(records, 3))
    for name, spans in expected.items():
        assert [span for span in receiver.spans if span.attributes["session.id"] == name] == spans


def test_a_restart_on_the_state_file_sends_nothing_twice_and_goes_on(tmp_path):
    records, expected = _interleaved()
    receiver = _Receiver()
    half = len(records) // 2
    _run(tmp_path / "otel.sqlite", receiver, _batches(records[:half], 4))
    sent_before = len(receiver.spans)
    # the offsets were not committed: everything comes again, then the rest
    _run(tmp_path / "otel.sqlite", receiver, _batches(records, 5))
    assert 0 < sent_before < len(receiver.spans)
    assert sorted(receiver.spans, key=lambda s: s.span_id) == sorted(
        (span for spans in expected.values() for span in spans), key=lambda s: s.span_id)


def test_a_refused_batch_writes_no_state_and_is_sent_again_with_the_same_ids(tmp_path):
    records, expected = _interleaved()
    refusing = _Receiver(refuse=2)
    with pytest.raises(ExportError):
        _run(tmp_path / "otel.sqlite", refusing, _batches(records, 6))
    receiver = _Receiver()
    _run(tmp_path / "otel.sqlite", receiver, _batches(records, 6))
    everything = sorted((span for spans in expected.values() for span in spans), key=lambda s: s.span_id)
    assert sorted(refusing.spans + receiver.spans, key=lambda s: s.span_id) == everything
