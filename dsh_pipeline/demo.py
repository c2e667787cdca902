"""The main job: the whole pipeline on a local broker, checked end to end.

1. Start the local Kafka broker (unless a cluster is given).
2. Start the projector, the auditor and the archiver as separate processes.
3. Run the simulator (its own process): a fleet of v0, v3 and v4 sessions
   side by side with a few injected faults, writing the ground-truth
   manifest; beside it, ``real_agents`` real dsh 0.1.1rc1 agents behind a
   gateway, in front of a scripted model (:mod:`demo_agents`).
4. Show progress (events/s, consumer lag, sessions, findings) until every
   service has caught up with the events topic.
5. Compare the views with the ground truth, the findings with the injected
   defects and the archive with the shipped logs (:mod:`ground_truth`; the
   real agents' with their own session files, and the auditor's verdicts on
   their requests from its ``/metrics``); print a report.
6. Stop everything it started. The exit code is 0 only if all agrees; a
   failed run keeps its work folder and shows the last lines of each
   process's log. Its clients wait as long as a busy laptop needs
   (:data:`LOADED_HOST`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumers.archiver import ArchiverConfig
from consumers.auditor import AuditorConfig
from consumers.projector import ProjectorConfig
from consumers.runtime.postgres import display_location
from dsh_core.errors import PipelineError
from dsh_core.jsonvalue import decode_json
from dsh_pipeline.demo_agents import RUNTIME_VERSION, RealAgents, runtime_problem
from dsh_pipeline.ground_truth import compare
from dsh_pipeline.local_kafka import LocalKafka
from dsh_pipeline.local_postgres import DSN_ENVIRONMENT, LocalPostgres, create_database
from producers.fleet import formats_summary
from dsh_kafka.clients import make_admin, make_consumer
from dsh_kafka.config import ConsumerSettings, KafkaConfig
from dsh_kafka.topics import DEFAULT_PARTITIONS, TopicNames

__all__ = ["DemoConfig", "run_demo"]

#: The group each service runs in (its configuration's default).
GROUPS = {"projector": ProjectorConfig.group, "auditor": AuditorConfig.group, "archiver": ArchiverConfig.group}


@dataclass(frozen=True)
class LoadedHost:
    """How long the demo's clients and its monitor wait, sized for a laptop
    whose other processes keep every core busy: there the clients' defaults
    fail it (records not acknowledged within 30 s; heartbeats late by more
    than the 10 s session timeout, so the group moves partitions over and
    over)."""

    #: simulate: a record may wait this long for the cluster's acknowledgement.
    delivery_timeout: float = 180.0
    #: services: heartbeats (every min(3 s, a third of it)) may be late this long.
    session_timeout: float = 60.0
    #: the monitor gives up when no service's lag moved for this long ...
    stall: float = 180.0
    #: ... or when the services are not caught up after this long.
    deadline: float = 3600.0


LOADED_HOST = LoadedHost()
#: The lines of each log shown when the demo fails.
_FAILURE_LINES = 15


@dataclass(frozen=True)
class DemoConfig:
    sessions: int = 300
    seed: int = 7
    formats: tuple[int, ...] = (0, 3, 4)  # session formats, in turns: a mixed fleet
    bootstrap: str | None = None
    workdir: Path | None = None
    keep: bool = False
    real_agents: int = 0  # real dsh agents beside the simulated fleet (the command's default: 8 where installed)
    store: str = "sqlite"  # the view store's backend: "sqlite" or "postgres" (a local server, or $DSH_POSTGRES_DSN's)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dsh_pipeline.cli", *args]


def _start(command: list[str], log: Path) -> subprocess.Popen:
    """``command`` in a process of its own writing stdout and stderr to ``log``."""
    with open(log, "wb") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: How the demo reads topics: from the start, committed records only, in no group.
_READER = ConsumerSettings(group_id=None)

class _Monitor:
    """The pipeline as Kafka shows it: each service group's lag behind the
    events topic, and the outputs so far (view heads: sessions and the
    events they cover; committed findings)."""

    def __init__(self, kafka: KafkaConfig, names: TopicNames) -> None:
        self.names = names
        self.admin = make_admin(kafka)
        self.events = make_consumer(kafka, _READER, names.events)
        self.outputs = make_consumer(kafka, _READER, names.views, names.findings)
        self.heads: dict[bytes, int] = {}  # session -> next seq of its view
        self.findings = 0

    async def __aenter__(self) -> "_Monitor":
        for client in (self.admin, self.events, self.outputs):
            await client.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()
        await self.events.stop()
        await self.outputs.stop()

    async def lags(self) -> dict[str, int]:
        from aiokafka import TopicPartition
        from aiokafka.errors import GroupCoordinatorNotAvailableError
        topic = self.names.events
        ends = await self.events.end_offsets([TopicPartition(topic, p)
                                              for p in self.events.partitions_for_topic(topic) or ()])
        lags = {}
        for service, group in GROUPS.items():
            try:
                committed = await self.admin.list_consumer_group_offsets(group)
            except GroupCoordinatorNotAvailableError:  # a fresh broker: the offsets topic is still coming up
                committed = {}
            lags[service] = sum(end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items())
        return lags

    async def read_outputs(self) -> None:
        """Read the output topics up to their current ends (committed ones),
        for at most 5 s (the progress line waits for it)."""
        ends = await self.outputs.end_offsets(list(self.outputs.assignment()))
        give_up = time.monotonic() + 5
        while time.monotonic() < give_up and [p for p, end in ends.items() if await self.outputs.position(p) < end]:
            batch = await self.outputs.getmany(timeout_ms=100)
            for partition, records in batch.items():
                if partition.topic == self.names.views:
                    self.heads.update((r.key, json.loads(r.value)["seq"]) for r in records)
                else:
                    self.findings += len(records)


async def _follow(kafka: KafkaConfig, names: TopicNames, producers: list, services: list[subprocess.Popen],
                  logs: Path) -> None:
    """Print progress each second until every producer (the simulator, the
    real agents: anything with ``poll()`` and ``returncode``) is done and
    every service has caught up; raise if a service dies or all stall (:data:`LOADED_HOST`)."""
    deadline = time.monotonic() + LOADED_HOST.deadline
    last_events, last_time = None, time.monotonic()
    last_lags, moved = None, time.monotonic()  # when any lag last changed
    async with _Monitor(kafka, names) as monitor:
        while True:
            for service in services:
                if service.poll() is not None:
                    raise PipelineError(f"a service exited early (code {service.returncode}); see {logs}")
            producing = [p for p in producers if p.poll() is None]
            lags = await monitor.lags()
            await monitor.read_outputs()
            now = time.monotonic()
            events = sum(monitor.heads.values())
            rate = "-" if last_events is None else f"{(events - last_events) / max(now - last_time, 1e-6):,.0f}"
            last_events, last_time = events, now
            print(f"  {events:>8,} events in views ({rate:>7} events/s)  sessions {len(monitor.heads):>5,}  findings "
                  f"{monitor.findings:>3,}  lag (records): projector {lags['projector']:,}, auditor "
                  f"{lags['auditor']:,}, archiver {lags['archiver']:,}", flush=True)
            if not producing and (any(p.returncode for p in producers) or not any(lags.values())):
                return
            if lags != last_lags or producing:
                last_lags, moved = lags, now
            elif now - moved > LOADED_HOST.stall:
                stalled = ", ".join(name for name, lag in lags.items() if lag)
                raise PipelineError(f"no progress for {LOADED_HOST.stall:g} s ({stalled} still behind); see {logs}")
            if now > deadline:
                raise PipelineError(f"the services did not catch up within {LOADED_HOST.deadline:g} s; see {logs}")
            await asyncio.sleep(1.0)


async def _findings(kafka: KafkaConfig, names: TopicNames) -> list[dict]:
    consumer = make_consumer(kafka, _READER, names.findings)
    await consumer.start()
    found: list[dict[str, Any]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=1500)
            if not batch:
                return found
            found.extend(json.loads(r.value) for records in batch.values() for r in records)
    finally:
        await consumer.stop()


def _wait_indexed(store: Path | str, findings: int, timeout: float = 60.0) -> dict[str, int]:
    """The store's session, finding and dead-letter counts once it indexed
    ``findings`` findings (or the deadline passed: the report says so)."""
    from consumers.projector.store_reader import StoreReader
    deadline = time.monotonic() + timeout
    while True:
        reader = StoreReader(store)
        try:
            counts = reader.counts()
        finally:
            reader.close()
        if counts["findings"] >= findings or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)  # wait-ok: polling a condition with a deadline


def run_demo(config: DemoConfig) -> int:
    # The progress monitor's clients retry the leadership errors of topics
    # just created; aiokafka would log each retry over the progress lines.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    if config.real_agents < 0:
        raise PipelineError(f"--real-agents takes 0 or more agents, not {config.real_agents}")
    if config.real_agents and (problem := runtime_problem()):
        raise PipelineError(f"--real-agents {config.real_agents}: {problem} (--real-agents 0 runs without them)")
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="dsh-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker = postgres = None
    children: list[subprocess.Popen] = []
    agents: RealAgents | None = None
    run: Path | None = None
    agreed = False  # the work folder goes only after a run where everything agreed
    started = time.monotonic()
    try:
        if config.bootstrap:  # a cluster of the user's: its security settings come from DSH_KAFKA_*, for every process
            kafka = KafkaConfig.from_env(config.bootstrap)
        else:
            print("starting the local Kafka broker (Apache Kafka jars from Maven Central, cached) ...", flush=True)
            broker = LocalKafka(workdir / "broker")
            kafka = KafkaConfig(broker.start())
        bootstrap = kafka.bootstrap
        prefix = f"demo{uuid.uuid4().hex[:6]}."
        names = TopicNames.with_prefix(prefix)
        common = ["--bootstrap", bootstrap, "--topic-prefix", prefix]
        run = workdir / prefix.rstrip(".")  # a reused --workdir keeps each run's stores apart
        run.mkdir()
        logs = run / "logs"
        logs.mkdir()
        sim_log = run / "simulator.log"
        archive, manifest_path = run / "archive", run / "manifest.json"
        db: Path | str = run / "views.sqlite"
        if config.store == "postgres":
            server = os.environ.get(DSN_ENVIRONMENT)
            if not server:
                print("starting a local PostgreSQL (Debian's server binaries) ...", flush=True)
                postgres = LocalPostgres()
                server = postgres.start()
            db = create_database(server, "demo")
        print(f"broker {bootstrap}; view store {display_location(str(db))}; work folder {run}", flush=True)
        from dsh_kafka.admin import prepare_topics
        asyncio.run(prepare_topics(kafka, names, DEFAULT_PARTITIONS))
        metrics = f"http://127.0.0.1:{(metrics_port := _free_port())}/metrics"  # the auditor's wire verdicts
        for name, args in (("projector", ["project", "--store", str(db)]),
                           ("auditor", ["audit", "--state", str(run / "auditor-state.sqlite"),
                                        "--metrics-port", str(metrics_port)]),
                           ("archiver", ["archive", "--root", str(archive)])):
            args += ["--session-timeout", str(LOADED_HOST.session_timeout)]
            children.append(_start(_cli(*args, *common), logs / f"{name}.log"))
        faults = max(1, config.sessions // 100)
        simulate = _cli("simulate", "--sessions", str(config.sessions), "--seed", str(config.seed),
                        "--format", ",".join(map(str, config.formats)),
                        "--manifest", str(manifest_path), "--delivery-timeout", str(LOADED_HOST.delivery_timeout),
                        *common, *[f"--fault-{kind}={faults}"
                                   for kind in ("unlogged", "dropped", "duplicate", "lossless", "unknown")])
        print(f"simulating {config.sessions} agents (formats {', '.join(f'v{v}' for v in config.formats)} in turns) "
              f"with {faults} fault(s) of each kind ...", flush=True)
        sim = _start(simulate, sim_log)
        services = list(children)
        children.append(sim)
        producers: list = [sim]
        if config.real_agents:
            agents = RealAgents(config.real_agents, run, _cli, common)
            print(f"running {config.real_agents} real dsh {RUNTIME_VERSION} agents (JSON-RPC) beside them, through a "
                  f"gateway in front of a scripted model ...", flush=True)
            agents.start()
            producers.append(agents)
        asyncio.run(_follow(kafka, names, producers, services, logs))
        if sim.returncode != 0:
            return 1  # the simulator's log says why
        print(sim_log.read_text().strip(), flush=True)
        manifest = decode_json(manifest_path.read_bytes())
        findings = asyncio.run(_findings(kafka, names))
        real_line = agents.report(metrics) if agents else None  # while the auditor serves its metrics
        indexed = _wait_indexed(db, len(findings))
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait(60)
        real = agents.session_files() if agents else {}
        problems = compare(manifest, db, archive, findings, real) + (agents.problems if agents else [])
        rules = collections.Counter(f["rule"] for f in findings)
        print(f"\nreport after {time.monotonic() - started:.0f} s")
        print(f"  sessions {manifest['sessions']} ({formats_summary(manifest)}), events {manifest['events']}, attestations "
              f"{manifest['attestations']}")
        print(f"  injected {manifest['injected']}")
        print(f"  findings {dict(sorted(rules.items()))}")
        print(f"  view store ({config.store}): {indexed['sessions']} sessions, {indexed['findings']} findings and "
              f"{indexed['deadLetters']} dead letters indexed")
        if indexed["findings"] != len(findings):
            problems.append(f"the view store indexed {indexed['findings']} findings, the topic holds {len(findings)}")
        if real_line:
            print(real_line)
        print("  views checked against ground truth, archive checked against shipped logs" +
              (", real agents' views and archive against their session files" if agents else ""))
        if problems:
            print(f"  DISAGREEMENTS ({len(problems)}):")
            for problem in problems[:50]:
                print(f"    {problem}")
            return 1
        print("  everything agrees: views = ground truth, findings = injected defects, archive = shipped logs" +
              ("; every real agent's request verified" if agents else ""))
        agreed = True
        return 0
    finally:
        if agents is not None:
            agents.close()
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if broker is not None:
            broker.stop()
        if postgres is not None:
            postgres.stop()
        if not agreed:
            _tell_failure(workdir, run, broker)
        elif not config.keep and config.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _tell_failure(workdir: Path, run: Path | None, broker: LocalKafka | None) -> None:
    """Where the failed run's files are kept, and the last lines each
    process of it wrote."""
    logs = ([broker.log_path] if broker is not None else []) + (
        sorted((run / "logs").glob("*.log")) + [run / "simulator.log"] if run is not None else [])
    print(f"\nthe demo failed; its work folder is kept: {run or workdir}", file=sys.stderr)
    for log in logs:
        try:
            lines = log.read_text(errors="replace").splitlines()[-_FAILURE_LINES:]
        except FileNotFoundError:
            continue
        print(f"--- {log.stem}, the last {len(lines)} lines of {log}:", *lines, sep="\n  ", file=sys.stderr)
