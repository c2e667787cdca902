"""The view store's backends: projector catch-up on PostgreSQL against
SQLite, two projector processes on PostgreSQL against one, and read API
latency with 50k sessions stored.

    python -m benchmarks.store [--events N] [--listed N] [--requests N]

Servers: the local Kafka broker and the local PostgreSQL the project starts
(or ``$DSH_KAFKA_BOOTSTRAP`` and ``$DSH_POSTGRES_DSN``).

1. Fills a topic with simulator traffic (≥ N events, default 200k); in the
   same run a projector catches up into a fresh SQLite file and into a fresh
   PostgreSQL database (from its assignment to the end offsets, every
   fetch, fold and store transaction in), each twice, in the order SQLite,
   PostgreSQL, PostgreSQL, SQLite. Ratio: SQLite's time over PostgreSQL's
   (≥ 1: PostgreSQL is as fast).
2. One projector process and two in one group, each run into a fresh
   PostgreSQL database (the way projectors on two hosts share one), in the
   order one, two, two, one: speedup = one's time over two's.
3. The PostgreSQL store of (1), its sessions copied under new ids by SQL to
   ``--listed`` sessions (default 50k); the read API (``serve``'s app on
   uvicorn) is asked ``--requests`` times (default 400) for the first page
   of the session list, a page filtered by status, and one conversation's
   first page (its surface events by seq, with their derived messages):
   p50 and p99 of each, over HTTP on loopback.

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from benchmarks import local_bootstrap
from benchmarks.pipeline import catch_up, fill, scaled_out
from consumers.projector import ProjectorConfig, projector_service
from consumers.projector.store_reader import StoreReader
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.config import BOOTSTRAP_ENV, KafkaConfig
from dsh_kafka.topics import DEFAULT_PARTITIONS, TopicNames
from dsh_pipeline.local_postgres import DSN_ENVIRONMENT, LocalPostgres, create_database
from dsh_pipeline.web import read_api
from producers.asgi_server import AsgiServer
from producers.simulator import SimulatorConfig

_TOKEN = "benchmark-token"
#: Each catch-up twice, in an order that gives neither backend the first or the last run.
_ROUNDS = ("sqlite", "postgres", "postgres", "sqlite")


def _project(kafka: KafkaConfig, names: TopicNames, ends: dict, store) -> float:
    return asyncio.run(catch_up(projector_service(ProjectorConfig(
        kafka=kafka, topics=names, group=f"p{uuid.uuid4().hex[:6]}", store=store)), ends))


def _grow(dsn: str, listed: int) -> tuple[int, list[str]]:
    """Copy the stored sessions (their listing and usage rows) under new ids
    until ``listed`` sessions are stored; the originals' ids."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        originals = [row[0] for row in connection.execute("SELECT session_id FROM sessions")]
        copies = -(-listed // len(originals)) - 1
        with connection.transaction():
            for copy in range(1, copies + 1):
                connection.execute(
                    "INSERT INTO sessions (session_id, status, next_seq, view, snapshot, error, cwd, created_at, "
                    "last_activity, turn_count, message_count) SELECT session_id || %s, status, next_seq, view, "
                    "NULL, error, cwd, created_at - %s, last_activity - %s, turn_count, message_count FROM sessions "
                    "WHERE session_id = ANY(%s)", (f"~{copy}", copy * 60_000, copy * 60_000, originals))
                connection.execute("INSERT INTO usage SELECT session_id || %s, provider, model, inputtokens, "
                                    "outputtokens, cachereadtokens, cachewritetokens, reasoningtokens FROM usage "
                                    "WHERE session_id = ANY(%s)", (f"~{copy}", originals))
        connection.execute("ANALYZE")
        (stored,) = connection.execute("SELECT COUNT(*) FROM sessions").fetchall()[0]
    return stored, originals


async def _latencies(url: str, paths: list[str]) -> list[float]:
    """Milliseconds per GET, one after another on one kept-alive connection."""
    timings = []
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {_TOKEN}"}) as client:
        for path in paths:
            started = time.perf_counter()
            response = await client.get(path)
            timings.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:200]}")
    return timings


async def _api(dsn: str, originals: list[str], requests: int) -> dict[str, tuple[float, float]]:
    reader = StoreReader(dsn)
    try:
        async with AsgiServer(read_api(reader, frozenset({_TOKEN})), "the read API") as server:
            rng = random.Random(7)
            runs = {"list": ["/api/v1/sessions?limit=50"] * requests,
                    "list_by_status": ["/api/v1/sessions?limit=50&status=idle"] * requests,
                    "session": [f"/api/v1/sessions/{rng.choice(originals)}" for _ in range(requests)]}
            await _latencies(server.url, runs["list"][:20] + runs["session"][:20])  # warm-up
            return {name: _p50_p99(await _latencies(server.url, paths)) for name, paths in runs.items()}
    finally:
        reader.close()


def _p50_p99(timings: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(timings, n=100)
    return cuts[49], cuts[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--listed", type=int, default=50_000)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = os.environ.get(BOOTSTRAP_ENV) or local_bootstrap(stack)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.chmod(0o711)  # the server may run as another user (root's postgres), who must reach its folder
        # a data folder of its own: fsync on, as a server that keeps its data runs
        server = os.environ.get(DSN_ENVIRONMENT)
        if not server:
            local = LocalPostgres(work / "postgres")
            server = local.start()  # a start that fails stops what it began
            stack.callback(local.stop)
        kafka = KafkaConfig(bootstrap)
        names = TopicNames.with_prefix(f"store{uuid.uuid4().hex[:6]}.")
        asyncio.run(prepare_topics(kafka, names, DEFAULT_PARTITIONS))
        sessions = max(50, args.events // 300)
        events = asyncio.run(fill(kafka, names, SimulatorConfig(sessions=sessions, seed=99)))
        ends = asyncio.run(end_offsets(kafka, names.events))
        print(f"filled: {sessions} sessions, {events:,} events, {sum(ends.values()):,} records")

        backends = {"sqlite": 0.0, "postgres": 0.0}  # seconds, summed over the rounds
        for turn, backend in enumerate(_ROUNDS):
            store: Path | str
            if backend == "postgres":
                postgres = store = create_database(server, "bench")  # the last is grown for the API in (3)
            else:
                store = work / f"views-{turn}.sqlite"
            backends[backend] += _project(kafka, names, ends, store)
        sqlite_s, postgres_s = backends["sqlite"], backends["postgres"]
        print(f"catch-up: SQLite {2 * events / sqlite_s:,.0f} events/s, PostgreSQL {2 * events / postgres_s:,.0f} "
              f"events/s ({sqlite_s / postgres_s:.2f}x)")

        members = {1: 0.0, 2: 0.0}
        for turn, count in enumerate((1, 2, 2, 1)):
            (work / f"members-{turn}").mkdir()
            members[count] += scaled_out("projector", bootstrap, names, ends, count, work / f"members-{turn}",
                                         create_database(server, "bench"))
        one_s, two_s = members[1], members[2]
        print(f"PostgreSQL, one process {2 * events / one_s:,.0f} events/s, two processes {2 * events / two_s:,.0f} "
              f"events/s ({one_s / two_s:.2f}x)")

        stored, originals = _grow(postgres, args.listed)
        latency = asyncio.run(_api(postgres, originals, args.requests))
        for name, (p50, p99) in latency.items():
            print(f"read API with {stored:,} sessions, {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        print(json.dumps({"events": events, "postgres_vs_sqlite_ratio": round(sqlite_s / postgres_s, 3),
                          "postgres_two_process_speedup": round(one_s / two_s, 3), "sessions_stored": stored,
                          "api_list_p99_ms": round(latency["list"][1], 1),
                          "api_list_by_status_p99_ms": round(latency["list_by_status"][1], 1),
                          "api_session_p99_ms": round(latency["session"][1], 1), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
