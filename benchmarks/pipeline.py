"""Consumer throughput against a bare getmany loop, latency, and memory.

    python -m benchmarks.pipeline [--events N] [--sessions-rss N] [--bootstrap HOST:PORT]

1. Fills a topic with simulator traffic (≥ N events, default 500k), then, in
   the same run, reads it with a bare aiokafka ``getmany`` loop (baseline),
   with the projector (views committed) and with the auditor (findings and
   offsets committed); prints events/s and the ratios to the baseline.
2. End-to-end latency: publishes at a steady 5k events/s for 20 s while a
   projector runs; latency is view-commit time minus the record's Kafka
   timestamp (its publish time), p50 and p99.
3. Peak RSS of a projector process that touches ``--sessions-rss`` sessions
   (default 50k).

The last line is one JSON object with all figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dsh_core.kafka.broker import LocalKafka
from dsh_core.kafka.config import BOOTSTRAP_ENV, ConsumerSettings, KafkaConfig
from dsh_core.kafka.topics import TopicNames
from dsh_pipeline.runtime import prepare_topics
from consumers.auditor import Auditor
from consumers.projector import Projector
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session


async def _fill(kafka: KafkaConfig, names: TopicNames, config: SimulatorConfig) -> int:
    events = 0
    async with Publisher(kafka, names) as publisher:
        for index in range(config.sessions):
            for batch in simulate_session(config, index)[1]:
                await publisher.send_many(batch)
                events += sum(r.count for r in batch)
        await publisher.flush()
    return events


async def _ends(kafka: KafkaConfig, topic: str) -> dict:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka.bootstrap)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(parts)).items()}
    finally:
        await consumer.stop()


async def _baseline(kafka: KafkaConfig, names: TopicNames, ends: dict) -> float:
    from aiokafka import AIOKafkaConsumer
    consumer = AIOKafkaConsumer(names.events, **{**ConsumerSettings(group_id=f"b{uuid.uuid4().hex[:6]}")
                                .consumer_options(kafka)})
    await consumer.start()
    try:
        start = time.perf_counter()
        done: dict[int, int] = {}
        while any(done.get(p, 0) < end for p, end in ends.items() if end):
            batch = await consumer.getmany(timeout_ms=500, max_records=ConsumerSettings.max_records)
            for tp, records in batch.items():
                done[tp.partition] = records[-1].offset + 1
        return time.perf_counter() - start
    finally:
        await consumer.stop()


async def _catch_up(service, ends: dict) -> float:
    """Seconds from the service's first handled record to the end offsets
    (start-up and group join, which the baseline also leaves out, excluded)."""
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    while not service._consumed:
        if task.done():
            task.result()
        await asyncio.sleep(0.001)
    start = time.perf_counter()
    while True:
        consumed = {tp.partition: offset for tp, offset in service._consumed.items()}
        if all(consumed.get(p, 0) >= end for p, end in ends.items() if end):
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - start
    stop.set()
    await task
    return elapsed


class _TimedProjector(Projector):
    """Records view-commit latency against each record's Kafka timestamp."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stamps: list[int] = []
        self.latencies: list[float] = []

    async def handle(self, record, decoded) -> None:
        self.stamps.append(record.timestamp)
        await super().handle(record, decoded)

    async def persist(self) -> None:
        await super().persist()
        now = time.time() * 1000
        self.latencies.extend(now - stamp for stamp in self.stamps)
        self.stamps = []


async def _latency(kafka: KafkaConfig, names: TopicNames, rate: int, seconds: float) -> tuple[float, float]:
    projector = _TimedProjector(kafka, names, Path(tempfile.mkdtemp()) / "v.sqlite",
                                settings=ConsumerSettings(group_id=f"lat{uuid.uuid4().hex[:6]}", auto_offset_reset="latest"))
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    # Sessions are generated before the clock starts: generating one blocks
    # the event loop the projector shares (agents publish from elsewhere).
    config = SimulatorConfig(sessions=2000, seed=77)
    batches, planned, index = [], 0, 0
    while planned < rate * seconds:
        for batch in simulate_session(config, index)[1]:
            batches.append(batch)
            planned += sum(r.count for r in batch)
        index += 1
    await asyncio.sleep(3)  # let the group settle before the clock starts
    async with Publisher(kafka, names) as publisher:
        start = time.monotonic()
        sent = 0
        for batch in batches:
            await publisher.send_many(batch)
            sent += sum(r.count for r in batch)
            await publisher.flush()
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)
    await asyncio.sleep(2)
    stop.set()
    await task
    latencies = sorted(projector.latencies)
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


_RSS_CHILD = """
import asyncio, resource, sys, time
from pathlib import Path
from consumers.projector import Projector
from dsh_core.kafka.config import ConsumerSettings, KafkaConfig
from dsh_core.kafka.topics import TopicNames
bootstrap, prefix, db, expected = sys.argv[1:5]
async def main():
    p = Projector(KafkaConfig(bootstrap), TopicNames.with_prefix(prefix), Path(db),
                  settings=ConsumerSettings(group_id='rss'))
    stop = asyncio.Event()
    task = asyncio.create_task(p.run(stop))
    while sum(p._consumed.values()) < int(expected):
        await asyncio.sleep(0.2)
    stop.set(); await task
asyncio.run(main())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--sessions-rss", type=int, default=50_000)
    parser.add_argument("--bootstrap", default=os.environ.get(BOOTSTRAP_ENV))
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(LocalKafka(heap="1g")).bootstrap
        kafka = KafkaConfig(bootstrap)
        names = TopicNames.with_prefix(f"pipe{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, names, 12))
        sessions = max(50, args.events // 300)
        events = asyncio.run(_fill(kafka, names, SimulatorConfig(sessions=sessions, seed=99)))
        ends = asyncio.run(_ends(kafka, names.events))
        print(f"filled: {sessions} sessions, {events:,} events, {sum(ends.values()):,} records")
        base = asyncio.run(_baseline(kafka, names, ends))
        with tempfile.TemporaryDirectory() as tmp:
            project = asyncio.run(_catch_up(Projector(kafka, names, Path(tmp) / "v.sqlite",
                                                      settings=ConsumerSettings(group_id=f"p{uuid.uuid4().hex[:6]}")), ends))
        audit = asyncio.run(_catch_up(Auditor(kafka, names, settings=ConsumerSettings(group_id=f"a{uuid.uuid4().hex[:6]}")),
                                      ends))
        rates = {"baseline": events / base, "projector": events / project, "auditor": events / audit}
        for name, rate in rates.items():
            print(f"{name:>9}: {rate:12,.0f} events/s  ({rate / rates['baseline']:.2f}x)")
        lat_names = TopicNames.with_prefix(f"lat{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, lat_names, 12))
        p50, p99 = asyncio.run(_latency(kafka, lat_names, 5000, 20))
        print(f"latency publish → view committed at 5k events/s: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
        rss_names = TopicNames.with_prefix(f"rss{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, rss_names, 12))
        asyncio.run(_fill(kafka, rss_names, SimulatorConfig(sessions=args.sessions_rss, seed=5, min_turns=1,
                                                             max_turns=1)))
        rss_ends = asyncio.run(_ends(kafka, rss_names.events))
        with tempfile.TemporaryDirectory() as tmp:
            child = subprocess.run([sys.executable, "-c", _RSS_CHILD, bootstrap, rss_names.events[:-len("dsh.session-events")],
                                    str(Path(tmp) / "v.sqlite"), str(sum(rss_ends.values()))],
                                   capture_output=True, text=True, check=True)
        rss_mb = int(child.stdout.strip().splitlines()[-1]) / 1024
        print(f"projector peak RSS with {args.sessions_rss:,} sessions touched: {rss_mb:.0f} MB")
        print(json.dumps({"baseline_events_per_s": round(rates["baseline"]),
                          "projector_ratio": round(rates["projector"] / rates["baseline"], 3),
                          "auditor_ratio": round(rates["auditor"] / rates["baseline"], 3),
                          "latency_p50_ms": round(p50), "latency_p99_ms": round(p99),
                          "projector_peak_rss_mb": round(rss_mb)}))


if __name__ == "__main__":
    main()
