"""Publisher throughput against a bare aiokafka producer, and shipper backfill.

    python -m benchmarks.produce [--events N] [--bootstrap HOST:PORT]

1. Simulator traffic (≥ N events, default 300k) is rendered to records once,
   then sent to Kafka twice in the same run with the same producer settings:
   through the Publisher, batch by batch as the agents append them
   (``send_many``: size checks, delivery tracking, metrics), and by a bare
   aiokafka producer sending the same keys, values and headers one by one. Prints events/s and MB/s of both and the ratio.
2. The shipper backfills a sessions root made of the corpus logs repeated
   to ≥ 200k events (raw and zstd files) and reports events/s.

Without --bootstrap (or $DSH_KAFKA_BOOTSTRAP) a local broker is started.
The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import local_bootstrap
from dsh_kafka.clients import make_producer
from dsh_kafka.config import BOOTSTRAP_ENV, KafkaConfig, ProducerSettings
from dsh_kafka.topics import TopicNames
from dsh_core.storage.framing import compress_frame
from dsh_core.storage.layout import Compression, log_path
from dsh_core.jsonvalue import decode_json
from dsh_kafka.admin import cluster_id, prepare_topics
from producers.publisher import Publisher
from producers.shipper import Destination, Shipper, ShipperConfig
from producers.simulator import SimulatorConfig, simulate_session

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("DSH_CORPUS", ROOT / "tests" / "corpus"))


def _batches(min_events: int) -> list[list]:
    """Simulator traffic as the agents' append batches (lists of records)."""
    sessions = 100
    while True:
        config = SimulatorConfig(sessions=sessions, seed=42)
        batches = [batch for index in range(sessions) for batch in simulate_session(config, index)[1] if batch]
        if sum(r.count for batch in batches for r in batch) >= min_events:
            return batches
        sessions *= 2


async def _publisher_run(kafka: KafkaConfig, names: TopicNames, batches: list) -> float:
    async with Publisher(kafka, names) as publisher:
        start = time.perf_counter()
        for batch in batches:
            await publisher.send_many(batch)
        await publisher.flush()
        return time.perf_counter() - start


async def _bare_run(kafka: KafkaConfig, names: TopicNames, batches: list) -> float:
    producer = make_producer(kafka, ProducerSettings())
    await producer.start()
    try:
        rendered = [(r.key, r.value, r.headers) for batch in batches for r in batch]
        start = time.perf_counter()
        for key, value, headers in rendered:
            await producer.send(names.events, key=key, value=value, headers=headers)
        await producer.flush()
        return time.perf_counter() - start
    finally:
        await producer.stop()


def _backfill_root(root: Path, min_events: int) -> int:
    logs = sorted((CORPUS / "dsh-real").glob("*.jsonl"))
    events = copy = 0
    while events < min_events:
        for i, log in enumerate(logs):
            data = log.read_bytes()
            lines = data.split(b"\n")
            header = decode_json(lines[0])
            session_id = f"{header['id']}-copy{copy}"
            head = json.dumps({**header, "id": session_id}, separators=(",", ":")).encode()
            body = [line + b"\n" for line in lines[1:] if line]
            compression: Compression = "zstd" if i % 2 else "none"
            path = log_path(root, header.get("cwd"), session_id, compression)
            path.parent.mkdir(parents=True, exist_ok=True)
            if compression == "zstd":
                path.write_bytes(compress_frame(head + b"\n") + b"".join(
                    compress_frame(b"".join(body[j:j + 30])) for j in range(0, len(body), 30)))
            else:
                path.write_bytes(head + b"\n" + b"".join(body))
            for line in body:
                value = decode_json(line)
                events += len(value["data"].get("texts", value["data"].get("args", ()))) if "seq0" in value else 1
        copy += 1
    return events


async def _backfill(kafka: KafkaConfig, names: TopicNames, root: Path, state: Path) -> float:
    async with Publisher(kafka, names) as publisher:
        shipper = Shipper(ShipperConfig(root=root, state_dir=state, once=True), publisher.send, publisher.flush,
                          report=print, say=lambda line: None,
                          destination=Destination(await cluster_id(kafka), names.events))
        start = time.perf_counter()
        await shipper.run(asyncio.Event())
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--bootstrap", default=os.environ.get(BOOTSTRAP_ENV))
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or local_bootstrap(stack)
        kafka = KafkaConfig(bootstrap)
        batches = _batches(args.events)
        records = [record for batch in batches for record in batch]
        events = sum(r.count for r in records)
        megabytes = sum(len(r.value) for r in records) / 1e6
        print(f"simulator traffic: {len(records):,} records, {events:,} events, {megabytes:.1f} MB of values")
        best = {"publisher": 0.0, "baseline": 0.0}
        for _ in range(3):  # alternate, best of three each, fresh topics every run
            for name, run in (("baseline", _bare_run), ("publisher", _publisher_run)):
                names = TopicNames.with_prefix(f"bench{uuid.uuid4().hex[:8]}.")
                asyncio.run(prepare_topics(kafka, names, 12))
                seconds = asyncio.run(run(kafka, names, batches))
                best[name] = max(best[name], events / seconds)
        ratio = best["publisher"] / best["baseline"]
        mb_rate = megabytes / (events / best["publisher"])
        print(f"publisher: {best['publisher']:12,.0f} events/s ({mb_rate:.1f} MB/s)")
        print(f"bare aiokafka: {best['baseline']:8,.0f} events/s ({megabytes / (events / best['baseline']):.1f} MB/s)")
        print(f"ratio: {ratio:.2f}x")
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "root"
            backfill_events = _backfill_root(root, 200_000)
            names = TopicNames.with_prefix(f"bench{uuid.uuid4().hex[:8]}.")
            asyncio.run(prepare_topics(kafka, names, 12))
            seconds = asyncio.run(_backfill(kafka, names, root, Path(tmp) / "state"))
        print(f"shipper backfill: {backfill_events:,} events in {seconds:.1f} s = {backfill_events / seconds:,.0f} events/s")
        print(json.dumps({"publisher_events_per_s": round(best["publisher"]), "baseline_events_per_s": round(best["baseline"]),
                          "ratio": round(ratio, 3), "publisher_mb_per_s": round(mb_rate, 1),
                          "shipper_backfill_events_per_s": round(backfill_events / seconds)}))


if __name__ == "__main__":
    main()
