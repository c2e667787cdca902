"""Log lines per minute of a broker outage, from the long-running services.

Starts a one-node local Kafka, publishes a simulated fleet, runs the
projector, auditor, archiver and shipper (following a root of session
logs) as the CLI runs them, waits until each is working, then kills the
broker for ``--outage`` seconds and starts it again. Each service's stderr
lines are counted by when they arrived: during the outage (reported per
minute) and in the ``--recovery`` seconds after the broker is back. With
``--log-format json`` every line must be one JSON object; a line that is
not is counted and shown.

    python -m benchmarks.outage_logs [--outage 60] [--recovery 30] [--log-format text]
                                     [--tree /path/to/another/checkout]

``--tree`` runs the services of another checkout (its ``.venv``), e.g. to
compare with the main branch; the broker and the measurement are this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from dsh_core.jsonvalue import decode_json
from dsh_core.storage.layout import log_path
from dsh_pipeline.local_cluster import LocalCluster
from producers.simulator import SimulatorConfig, simulate_session

SERVICES = ("project", "audit", "archive", "ship")


@dataclass
class _Lines:
    """A service's stderr lines, each with when it arrived."""

    process: subprocess.Popen
    arrived: list[tuple[float, str]] = field(default_factory=list)
    reader: threading.Thread | None = None

    def read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.arrived.append((time.monotonic(), line.rstrip("\n")))

    def between(self, start: float, end: float) -> list[str]:
        return [line for at, line in self.arrived if start <= at < end]


def _write_root(root: Path, sessions: int) -> None:
    config = SimulatorConfig(sessions=sessions, seed=77, max_turns=2)
    for index in range(sessions):
        records = [record for batch in simulate_session(config, index)[1] for record in batch
                   if record.kind in ("header", "record")]
        header = decode_json(records[0].value)
        path = log_path(root, header.get("cwd"), header["id"], "none")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(record.value + b"\n" for record in records))


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"outage_logs: timed out waiting for {what}")
        threading.Event().wait(0.2)


@dataclass
class Outage:
    """What each service wrote during the outage and after it."""

    seconds: float
    after_seconds: float
    during: dict[str, list[str]]
    after: dict[str, list[str]]


def measure(tree: Path, outage: float, recovery: float, log_format: str) -> Outage:
    """Run the services of the checkout ``tree`` through a broker outage of
    ``outage`` seconds; their lines during it and ``recovery`` s after it
    (the services are stopped then: lines they say when stopping count)."""
    python = str(tree / ".venv" / "bin" / "python")
    work = Path(tempfile.mkdtemp(prefix="dsh-outage-logs-"))
    prefix = f"o{uuid.uuid4().hex[:6]}."
    cluster = LocalCluster(1, work / "kafka")
    bootstrap = cluster.start()
    common = ["--bootstrap", bootstrap, "--topic-prefix", prefix, "--partitions", "4", "--log-format", log_format]

    def cli(*command: str) -> list[str]:
        return [python, "-m", "dsh_pipeline.cli", *command, *common]

    services: dict[str, _Lines] = {}
    try:
        subprocess.run(cli("simulate", "--sessions", "40"), cwd=tree, check=True, capture_output=True)
        root = work / "root"
        root.mkdir()
        _write_root(root, 40)
        commands = {"project": cli("project", "--store", str(work / "views.sqlite")),
                    "audit": cli("audit", "--state", str(work / "auditor.sqlite")),
                    "archive": cli("archive", "--root", str(work / "archive")),
                    "ship": cli("ship", "--root", str(root), "--state", str(work / "ship-state"))}
        for name, command in commands.items():
            process = subprocess.Popen(command, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            services[name] = lines = _Lines(process)
            lines.reader = threading.Thread(target=lines.read, daemon=True)
            lines.reader.start()
        _wait(lambda: all(any("caught up" in line for _, line in services[name].arrived)
                          for name in ("project", "audit", "archive")), 180, "the consumers to catch up")
        _wait(lambda: (work / "ship-state" / "shipper-checkpoints.json").exists(), 60, "the shipper's first pass")
        down = time.monotonic()
        cluster.kill(1)
        threading.Event().wait(outage)  # wait-ok: the outage's length is what is measured
        cluster.start_node(1)
        back = time.monotonic()
        threading.Event().wait(recovery)  # wait-ok: the lines after it are counted over this time
    finally:
        for lines in services.values():
            lines.process.send_signal(signal.SIGTERM)
        for lines in services.values():
            try:
                lines.process.wait(30)
            except subprocess.TimeoutExpired:
                lines.process.kill()
                lines.process.wait(30)
            if lines.reader is not None:
                lines.reader.join(30)  # it ends at the pipe's end
            assert lines.process.stderr is not None
            lines.process.stderr.close()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    end = time.monotonic()
    return Outage(back - down, end - back, {name: lines.between(down, back) for name, lines in services.items()},
                  {name: lines.between(back, end) for name, lines in services.items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the broker stays down")
    parser.add_argument("--recovery", type=float, default=30.0, help="seconds counted after it is back")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="the checkout whose services run")
    args = parser.parse_args()
    measured = measure(args.tree, args.outage, args.recovery, args.log_format)
    minutes = measured.seconds / 60
    print(f"outage {measured.seconds:.0f} s (the broker killed, then started again), then {measured.after_seconds:.0f}"
          f" s after it was back, the services' SIGTERM included; {args.log_format} logs of {args.tree}")
    print(f"{'service':<10}{'outage lines':>14}{'per minute':>12}{'after':>8}{'non-JSON':>10}")
    for name in SERVICES:
        during, after = measured.during[name], measured.after[name]
        plain = [line for line in during + after if args.log_format == "json" and not _is_json(line)]
        print(f"{name:<10}{len(during):>14}{len(during) / minutes:>12.1f}{len(after):>8}{len(plain):>10}")
        for line in plain[:3]:
            print(f"    not JSON: {line[:160]}")
    for name in SERVICES:
        print(f"--- {name}: its lines during the outage and after")
        for line in measured.during[name] + measured.after[name]:
            print(f"    {line[:220]}")
    return 0


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
