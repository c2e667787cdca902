"""Consumer throughput against a bare getmany loop, latency, and memory.

    python -m benchmarks.pipeline [--events N] [--sessions-rss N] [--members N] [--bootstrap HOST:PORT]

1. Fills a topic with simulator traffic (≥ N events, default 500k), then, in
   the same run, reads it with a bare aiokafka ``getmany`` loop (baseline),
   with the consumer runtime decoding each record and doing nothing else
   (the ceiling of any service built on it: no fold, no store), with the
   projector (views committed) and with the auditor (findings and offsets
   committed), each as one process; then with ``--members``
   processes of each in one consumer group (default: one per CPU), the way
   the services scale out; prints events/s and the ratios to the baseline.
2. End-to-end latency: a publisher process (the agents) publishes at a
   steady 5k events/s for 20 s while a projector process runs; latency is
   view-commit time minus the record's Kafka timestamp (its publish time),
   p50 and p99, over every record.
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

from aiokafka import ConsumerRebalanceListener

from benchmarks import local_bootstrap, projector_peak_rss_mb
from dsh_core.jsonvalue import decode_json
from dsh_kafka.config import BOOTSTRAP_ENV, ConsumerSettings, KafkaConfig
from dsh_kafka.topics import DEFAULT_PARTITIONS, TopicNames
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.clients import make_consumer
from consumers.auditor import AuditorConfig, auditor_service
from consumers.projector import ProjectorConfig, projector_service
from consumers.runtime import ConsumerService, Policy, ProducerOutputs, ServiceConfig
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session


async def fill(kafka: KafkaConfig, names: TopicNames, config: SimulatorConfig) -> int:
    events = 0
    async with Publisher(kafka, names) as publisher:
        for index in range(config.sessions):
            for batch in simulate_session(config, index)[1]:
                await publisher.send_many(batch)
                events += sum(r.count for r in batch)
        await publisher.flush()
    return events


class _Assigned(ConsumerRebalanceListener):
    """Notes when the group first assigned the baseline its partitions."""

    def __init__(self) -> None:
        self.at: float | None = None

    async def on_partitions_revoked(self, revoked) -> None:
        pass

    async def on_partitions_assigned(self, assigned) -> None:
        if self.at is None:
            self.at = time.perf_counter()


async def _baseline(kafka: KafkaConfig, names: TopicNames, ends: dict) -> float:
    """Seconds from the group's assignment to the end offsets (start-up and
    the group join left out, as for the services)."""
    consumer = make_consumer(kafka, ConsumerSettings(group_id=f"b{uuid.uuid4().hex[:6]}"))
    assigned = _Assigned()
    consumer.subscribe([names.events], listener=assigned)
    await consumer.start()
    try:
        done: dict[int, int] = {}
        while any(done.get(p, 0) < end for p, end in ends.items() if end):
            batch = await consumer.getmany(timeout_ms=500, max_records=ConsumerSettings.max_records)
            for tp, records in batch.items():
                done[tp.partition] = records[-1].offset + 1
        if assigned.at is None:
            raise RuntimeError("the group never assigned the baseline its partitions")
        return time.perf_counter() - assigned.at
    finally:
        await consumer.stop()


class _DecodeOnly(Policy):
    """A policy that decodes each record's JSON value and keeps nothing:
    what every service pays on the runtime before its own work."""

    name = "decode-only"

    def handle(self, record, decoded) -> None:
        decode_json(decoded.value)

    def persist(self) -> None:
        pass


def _decode_only(kafka: KafkaConfig, names: TopicNames) -> ConsumerService:
    config = ServiceConfig(kafka=kafka, topics=names, group=f"d{uuid.uuid4().hex[:6]}")
    return ConsumerService(config, _DecodeOnly(config), ProducerOutputs(kafka, names, _DecodeOnly.name))


async def catch_up(service: ConsumerService, ends: dict) -> float:
    """Seconds from the service's first assignment (its policy's
    ``assigned`` done) to the end offsets: start-up and the group join left
    out, as for the baseline; every record's fetch and handling in."""
    assigned: list[float] = []
    policy_assigned = service.policy.assigned

    async def assigned_timed(partitions, committed) -> None:
        await policy_assigned(partitions, committed)
        if not assigned:
            assigned.append(time.perf_counter())

    setattr(service.policy, "assigned", assigned_timed)  # this instance's hook, timed
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    while True:
        consumed = {tp.partition: offset for tp, offset in service.positions().items()}
        if assigned and all(consumed.get(p, 0) >= end for p, end in ends.items() if end):
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - assigned[0]
    stop.set()
    await task
    return elapsed


# The projector of the latency run, in a fresh process of its own (as it is
# deployed): it records view-commit time minus each record's Kafka timestamp
# (its publish time), prints "ready" once it holds every partition at a
# resolved position ("latest" would skip what is published before that),
# then reads the end offsets from stdin, and prints p50 and p99 as JSON once
# every record up to them has its view committed.
_LATENCY_CHILD = """
import asyncio, json, sys, tempfile, time
from pathlib import Path
from consumers.projector import Projection, ProjectorConfig
from consumers.runtime import ConsumerService, ProducerOutputs
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
bootstrap, prefix, group, partitions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
class Timed(Projection):
    stamps, latencies = [], []
    def handle(self, record, decoded):
        self.stamps.append(record.timestamp)
        super().handle(record, decoded)
    def persist(self):
        super().persist()
        now = time.time() * 1000
        self.latencies.extend(now - stamp for stamp in self.stamps)
        self.stamps = []
async def main():
    kafka, names = KafkaConfig(bootstrap), TopicNames.with_prefix(prefix)
    config = ProjectorConfig(kafka=kafka, topics=names, group=group, store=Path(tempfile.mkdtemp()) / "v.sqlite",
                             start_from="latest")
    timed = Timed(config)
    projector = ConsumerService(config, timed, ProducerOutputs(kafka, names, Timed.name))
    stop = asyncio.Event()
    task = asyncio.create_task(projector.run(stop))
    while len(projector.assignment()) < partitions:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    for partition in projector.assignment():
        await projector.consumer.position(partition)
    print("ready", flush=True)
    ends = {int(p): end for p, end in json.loads(await asyncio.to_thread(sys.stdin.readline)).items()}
    while timed.stamps or any({tp.partition: o for tp, o in projector.positions().items()}.get(p, 0) < end
                              for p, end in ends.items()):
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    stop.set()
    await task
    latencies = sorted(timed.latencies)
    print(json.dumps([latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]]), flush=True)
asyncio.run(main())
"""


# The agents of the latency run, in a process of their own (as agents are):
# generates its sessions first, prints "ready", waits for a line on stdin,
# then publishes at a steady rate, one flush per batch.
_PUBLISH_CHILD = """
import asyncio, sys, time
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session
bootstrap, prefix, rate, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
config = SimulatorConfig(sessions=2000, seed=77)
batches, planned, index = [], 0, 0
while planned < rate * seconds:
    for batch in simulate_session(config, index)[1]:
        batches.append(batch)
        planned += sum(r.count for r in batch)
    index += 1
print("ready", flush=True)
sys.stdin.readline()
async def main():
    async with Publisher(KafkaConfig(bootstrap), TopicNames.with_prefix(prefix)) as publisher:
        start, sent = time.monotonic(), 0
        for batch in batches:
            await publisher.send_many(batch)
            sent += sum(r.count for r in batch)
            await publisher.flush()
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)
asyncio.run(main())
"""


async def _latency(kafka: KafkaConfig, names: TopicNames, rate: int, seconds: float) -> tuple[float, float]:
    prefix = names.events[:-len("dsh.session-events")]
    partitions = len(await end_offsets(kafka, names.events))
    projector = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _LATENCY_CHILD, kafka.bootstrap, prefix, f"lat{uuid.uuid4().hex[:6]}", str(partitions),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    agents = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PUBLISH_CHILD, kafka.bootstrap, prefix, str(rate), str(seconds),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert projector.stdin and projector.stdout and agents.stdin and agents.stdout  # all PIPE
    try:
        assert await projector.stdout.readline() == b"ready\n", "the latency projector failed"
        assert await agents.stdout.readline() == b"ready\n", "the latency publisher failed"
        agents.stdin.write(b"go\n")
        await agents.stdin.drain()
        assert await agents.wait() == 0, "the latency publisher failed"
        projector.stdin.write(json.dumps(await end_offsets(kafka, names.events)).encode() + b"\n")
        await projector.stdin.drain()
        p50, p99 = json.loads(await projector.stdout.readline())
        assert await projector.wait() == 0, "the latency projector failed"
        return p50, p99
    finally:
        for child in (projector, agents):
            if child.returncode is None:
                child.kill()
                await child.wait()


# One group member of a scaled-out service. It joins the group, reports its
# partition count in a file, and handles nothing until the parent creates the
# go file (all members assigned: the clock must not run through group
# formation, which the baseline also leaves out). It prints the wall-clock
# time of reaching the end offsets.
_MEMBER_CHILD = """
import asyncio, json, signal, sys, time
from pathlib import Path
from consumers.auditor import AuditorConfig, auditor_service
from consumers.projector import ProjectorConfig, projector_service
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
service, bootstrap, prefix, group, db, instance, work, ends = sys.argv[1:9]
ends = {int(p): e for p, e in json.loads(ends).items()}
work = Path(work)
async def main():
    kafka, names = KafkaConfig(bootstrap), TopicNames.with_prefix(prefix)
    store = db if db.startswith('postgres') else Path(db)
    member = (projector_service(ProjectorConfig(kafka=kafka, topics=names, group=group, store=store))
              if service == "projector" else auditor_service(AuditorConfig(kafka=kafka, topics=names, group=group)))
    policy_open, policy_assigned = member.policy.open, member.policy.assigned
    async def gated_open(outputs):  # the consumer exists, it has not fetched yet
        await policy_open(outputs)
        fetch = member.consumer.getmany
        async def gated(*args, **kwargs):
            while not (work / "go").exists():
                await asyncio.sleep(0.005)
            return await fetch(*args, **kwargs)
        member.consumer.getmany = gated
    async def noted_assigned(partitions, committed):
        await policy_assigned(partitions, committed)
        (work / f"assigned-{instance}").write_text(str(len(member.assignment())))
    member.policy.open, member.policy.assigned = gated_open, noted_assigned
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(member.run(stop))
    done = None
    while not stop.is_set():
        if task.done():
            task.result()
        mine = member.assignment()
        positions = member.positions()
        if done is None and mine and (work / "go").exists() and all(
                positions.get(tp, 0) >= ends.get(tp.partition, 0) for tp in mine):
            done = time.time()
            print(json.dumps({"done": done}), flush=True)
        await asyncio.sleep(0.005)
    await task
asyncio.run(main())
"""


def scaled_out(service: str, bootstrap: str, names: TopicNames, ends: dict, members: int, work: Path,
               store: str | None = None) -> float:
    """Seconds for ``members`` processes of one group to catch up, from the
    moment they may fetch (every member assigned) to the last one reaching
    its ends (the projectors' view store: ``store``, else a SQLite file in ``work``)."""
    prefix = names.events[:-len("dsh.session-events")]
    group = f"{service[0]}x{uuid.uuid4().hex[:6]}"
    command = [sys.executable, "-c", _MEMBER_CHILD, service, bootstrap, prefix, group, store or str(work / "views.sqlite")]
    children = [subprocess.Popen(command + [str(index), str(work), json.dumps(ends)], stdout=subprocess.PIPE,
                                 text=True) for index in range(members)]
    try:
        deadline = time.monotonic() + 120
        while True:  # every member holds a share of one generation's partitions
            counts = [(work / f"assigned-{index}") for index in range(members)]
            shares = [int(path.read_text() or 0) if path.exists() else 0 for path in counts]
            if all(shares) and sum(shares) == len(ends):
                break
            if time.monotonic() > deadline or any(child.poll() is not None for child in children):
                raise RuntimeError(f"{service} members did not form a group: {shares}")
            time.sleep(0.01)  # wait-ok: polling a condition with a deadline
        started = time.time()
        (work / "go").touch()
        times = [json.loads(child.stdout.readline()) for child in children if child.stdout is not None]
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(60)
    return max(t["done"] for t in times) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--sessions-rss", type=int, default=50_000)
    parser.add_argument("--bootstrap", default=os.environ.get(BOOTSTRAP_ENV))
    parser.add_argument("--members", type=int, default=os.cpu_count() or 2,
                        help="processes in one group for the scaled-out runs (default: the CPU count)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or local_bootstrap(stack)
        kafka = KafkaConfig(bootstrap)
        names = TopicNames.with_prefix(f"pipe{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, names, DEFAULT_PARTITIONS))
        sessions = max(50, args.events // 300)
        events = asyncio.run(fill(kafka, names, SimulatorConfig(sessions=sessions, seed=99)))
        ends = asyncio.run(end_offsets(kafka, names.events))
        print(f"filled: {sessions} sessions, {events:,} events, {sum(ends.values()):,} records")
        base = asyncio.run(_baseline(kafka, names, ends))
        decode_only = asyncio.run(catch_up(_decode_only(kafka, names), ends))
        with tempfile.TemporaryDirectory() as tmp:
            project = asyncio.run(catch_up(projector_service(ProjectorConfig(
                kafka=kafka, topics=names, group=f"p{uuid.uuid4().hex[:6]}", store=Path(tmp) / "v.sqlite")), ends))
        audit = asyncio.run(catch_up(auditor_service(AuditorConfig(
            kafka=kafka, topics=names, group=f"a{uuid.uuid4().hex[:6]}")), ends))
        members = args.members
        with tempfile.TemporaryDirectory() as tmp:
            project_scaled = scaled_out("projector", bootstrap, names, ends, members, Path(tmp))
        with tempfile.TemporaryDirectory() as tmp:
            audit_scaled = scaled_out("auditor", bootstrap, names, ends, members, Path(tmp))
        rates = {"baseline": events / base, "decode only": events / decode_only, "projector": events / project,
                 "auditor": events / audit,
                 f"projector x{members}": events / project_scaled, f"auditor x{members}": events / audit_scaled}
        for name, rate in rates.items():
            print(f"{name:>12}: {rate:12,.0f} events/s  ({rate / rates['baseline']:.2f}x)")
        lat_names = TopicNames.with_prefix(f"lat{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, lat_names, DEFAULT_PARTITIONS))
        p50, p99 = asyncio.run(_latency(kafka, lat_names, 5000, 20))
        print(f"latency publish → view committed at 5k events/s: p50 {p50:.0f} ms, p99 {p99:.0f} ms")
        rss_names = TopicNames.with_prefix(f"rss{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, rss_names, DEFAULT_PARTITIONS))
        asyncio.run(fill(kafka, rss_names, SimulatorConfig(sessions=args.sessions_rss, seed=5, min_turns=1,
                                                             max_turns=1)))
        rss_ends = asyncio.run(end_offsets(kafka, rss_names.events))
        rss_mb = projector_peak_rss_mb(bootstrap, rss_names.events[:-len("dsh.session-events")], sum(rss_ends.values()))
        print(f"projector peak RSS with {args.sessions_rss:,} sessions touched: {rss_mb:.0f} MB")
        print(json.dumps({"baseline_events_per_s": round(rates["baseline"]),
                          "decode_only_ratio": round(rates["decode only"] / rates["baseline"], 3),
                          "projector_ratio": round(rates["projector"] / rates["baseline"], 3),
                          "auditor_ratio": round(rates["auditor"] / rates["baseline"], 3),
                          "group_members": members,
                          "projector_group_ratio": round(rates[f"projector x{members}"] / rates["baseline"], 3),
                          "auditor_group_ratio": round(rates[f"auditor x{members}"] / rates["baseline"], 3),
                          "latency_p50_ms": round(p50), "latency_p99_ms": round(p99),
                          "projector_peak_rss_mb": round(rss_mb)}))


if __name__ == "__main__":
    main()
