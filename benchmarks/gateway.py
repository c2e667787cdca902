"""What the attesting gateway adds to a streaming model request.

    python -m benchmarks.gateway [--rounds N] [--interval-ms MS] [--large-mb MB] [--bootstrap HOST:PORT]

A scripted upstream answers every request with a Messages event stream of
24 events, the first at once and the rest ``--interval-ms`` apart (default
10: a model's token pace). The gateway runs as ``dsh-pipeline gateway`` (its
own process), publishing its attestations to Kafka (the local broker unless
``--bootstrap``). A load generator sends the same streaming requests at 1,
50 and 200 at a time (``--rounds`` times as many requests, 100 at least;
each run first opens its connections with one request each, not measured),
to the upstream directly (the baseline) and through the gateway,
alternating, in the same run; it measures time to first byte and to last
byte per request, the requests completed per second and the CPU time the
gateway (and the bare relay) spent per 1000 requests, its attesting
workers included (at one stream mostly its once-a-second idle work). A
third target is the same gateway sent the requests without their session
header, which it forwards without attesting: what forwarding and relaying cost without
the attestation's work. A fourth is the floor of the gateway's HTTP stack:
a pass-through proxy on the same server, client and event loop that does
nothing else (``benchmarks/bare_relay.py``). At 50 streams a fifth target
is the gateway again while one large request (``--large-mb``, default 7:
just under the size the gateway still parses) after another is in flight
beside the streams: what one client's large request costs the others'
time to first byte. Upstream and
load generator are one small Go program (``benchmarks/loadgen``, built
once into the cache) so that on a 2-core machine their own CPU leaves the
gateway room. Printed: p50 and p99 of each, their added milliseconds, the
throughput ratios and the CPU per 1000 requests; the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import local_bootstrap

CONCURRENCY = (1, 50, 200)
LARGE_BESIDE = 50  # the streams measured beside a large request
SOURCE = Path(__file__).parent / "loadgen"
#: The fleet credential the load generator shows (its ``Credential``).
CREDENTIAL = "benchmark-fleet-credential"


def _loadgen() -> Path:
    """The load generator, built from source when it changed."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dsh-pipeline" / "loadgen"
    stamp = str(max(path.stat().st_mtime_ns for path in SOURCE.iterdir()))
    binary = cache / f"loadgen-{stamp}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["go", "build", "-o", str(binary), "."], cwd=SOURCE, check=True)
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_listening(port: int, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"a benchmark process exited {process.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)  # wait-ok: polling a port with a deadline
    raise SystemExit(f"nothing listens on port {port} after {timeout} s")


def _load(loadgen: Path, url: str, concurrency: int, count: int, mode: str) -> dict:
    done = subprocess.run([str(loadgen), "load", url + "/v1/messages", str(concurrency), str(count)]
                          + ([mode] if mode else []), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the load generator failed on {url}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _cpu_ms(pid: int) -> float:
    """CPU time (user and system, ms) of process ``pid`` and of every process
    under it (the gateway's attesting workers)."""
    total, todo = 0.0, [pid]
    while todo:
        process = todo.pop()
        with contextlib.suppress(OSError):  # a process gone since it was listed
            with open(f"/proc/{process}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
            for task in os.listdir(f"/proc/{process}/task"):
                with open(f"/proc/{process}/task/{task}/children") as children:
                    todo.extend(int(child) for child in children.read().split())
    return total


def _quiet(pid: int, timeout: float = 60) -> None:
    """Wait until process ``pid`` and those under it use under a tenth of a
    core (the attestations of a run's large requests are still being read
    after it): a run's CPU is its own."""
    deadline, last = time.monotonic() + timeout, _cpu_ms(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)  # wait-ok: sampling CPU time, with a deadline
        now = _cpu_ms(pid)
        if now - last < 50:
            return
        last = now
    raise SystemExit(f"process {pid} still busy {timeout} s after a run")


def _measure(loadgen: Path, direct: str, gateway: tuple[str, int], bare: tuple[str, int], rounds: int,
             large_mb: int) -> dict[int, dict[str, dict]]:
    """Each target's figures at each concurrency, the mean of two runs; for a
    target served by a process of ours, ``cpu_per_1000``: that process's CPU
    milliseconds per 1000 requests (those that opened the connections too)."""
    results = {}
    for concurrency in CONCURRENCY:
        targets: dict[str, tuple[str, int | None, str]] = {
            "direct": (direct, None, ""), "gateway": (*gateway, ""), "unattested": (*gateway, "anonymous"),
            "bare relay": (*bare, "")}
        if concurrency == LARGE_BESIDE:
            targets["with large"] = (*gateway, f"large={large_mb}")
        count = max(100, concurrency * rounds) // 2
        runs: dict[str, list[dict]] = {name: [] for name in targets}
        for order in (tuple(targets), tuple(reversed(targets))):  # alternate, so none always goes first
            for name in order:
                url, pid, mode = targets[name]
                if pid is not None:
                    _quiet(pid)
                before = _cpu_ms(pid) if pid is not None else 0.0
                runs[name].append(_load(loadgen, url, concurrency, count, mode))
                if pid is not None:
                    runs[name][-1]["cpu_per_1000"] = (_cpu_ms(pid) - before) * 1000 / (count + concurrency)
        results[concurrency] = {name: {key: sum(r[key] for r in measured) / len(measured) for key in measured[0]}
                                for name, measured in runs.items()}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20,
                        help="requests per concurrency level and target: this many times the concurrency (100 at least)")
    parser.add_argument("--interval-ms", type=int, default=10, help="milliseconds between the upstream's events")
    parser.add_argument("--large-mb", type=int, default=7,
                        help=f"MiB of the large request beside {LARGE_BESIDE} streams (default 7)")
    parser.add_argument("--bootstrap", help="a Kafka cluster for the attestations (default: the local broker)")
    args = parser.parse_args()
    loadgen = _loadgen()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or local_bootstrap(stack)
        credentials = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "credentials"
        credentials.touch(0o600)
        credentials.write_text(f"loadgen {CREDENTIAL}\n")
        upstream_port, gateway_port, bare_port = _free_port(), _free_port(), _free_port()
        upstream = subprocess.Popen([str(loadgen), "upstream", str(upstream_port), str(args.interval_ms)])
        stack.callback(_stop, upstream)
        gateway = subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "gateway", "--listen",
                                    f"127.0.0.1:{gateway_port}", "--upstream", f"http://127.0.0.1:{upstream_port}",
                                    "--credentials-file", str(credentials), "--session-rate", "100",
                                    "--bootstrap", bootstrap, "--topic-prefix", f"bench{uuid.uuid4().hex[:6]}.",
                                    "--partitions", "12", "--log-level", "ERROR"])  # not a warning per unattested request
        stack.callback(_stop, gateway)
        bare = subprocess.Popen([sys.executable, "-m", "benchmarks.bare_relay", str(bare_port),
                                 f"http://127.0.0.1:{upstream_port}"])
        stack.callback(_stop, bare)
        _wait_listening(upstream_port, upstream)
        _wait_listening(gateway_port, gateway)
        _wait_listening(bare_port, bare)
        results = _measure(loadgen, f"http://127.0.0.1:{upstream_port}", (f"http://127.0.0.1:{gateway_port}",
                           gateway.pid), (f"http://127.0.0.1:{bare_port}", bare.pid), args.rounds, args.large_mb)
    summary = {}
    for concurrency, measured in results.items():
        direct = measured["direct"]
        print(f"c={concurrency:>3}: direct     {direct['rps']:7.0f} req/s, ttfb p50/p99 {direct['ttfb_p50']:.2f}/"
              f"{direct['ttfb_p99']:.2f} ms, last byte {direct['last_p50']:.2f}/{direct['last_p99']:.2f} ms")
        for name, suffix in (("gateway", ""), ("unattested", "_unattested"), ("bare relay", "_bare_relay"),
                             ("with large", "_large")):
            if name not in measured:
                continue
            through = measured[name]
            added = {key: round(through[key] - direct[key], 2) for key in ("ttfb_p50", "ttfb_p99", "last_p50",
                                                                           "last_p99")}
            ratio = through["rps"] / direct["rps"]
            print(f"       {name:<10} {through['rps']:7.0f} req/s ({ratio:.2f}x), ttfb p50/p99 "
                  f"{through['ttfb_p50']:.2f}/{through['ttfb_p99']:.2f} ms ({added['ttfb_p50']:+.2f}/"
                  f"{added['ttfb_p99']:+.2f}), last byte {through['last_p50']:.2f}/{through['last_p99']:.2f} ms "
                  f"({added['last_p50']:+.2f}/{added['last_p99']:+.2f}), {through['cpu_per_1000']:,.0f} ms CPU per "
                  f"1000 requests")
            summary[f"ttfb_p50_added_ms_c{concurrency}{suffix}"] = added["ttfb_p50"]
            summary[f"ttfb_p99_added_ms_c{concurrency}{suffix}"] = added["ttfb_p99"]
            summary[f"last_byte_p99_added_ms_c{concurrency}{suffix}"] = added["last_p99"]
            summary[f"throughput_ratio_c{concurrency}{suffix}"] = round(ratio, 3)
            summary[f"cpu_ms_per_1000_c{concurrency}{suffix}"] = round(through["cpu_per_1000"])
    without, beside = summary[f"ttfb_p99_added_ms_c{LARGE_BESIDE}"], summary[f"ttfb_p99_added_ms_c{LARGE_BESIDE}_large"]
    print(f"{LARGE_BESIDE} streams' p99 added time to first byte: {without:+.2f} ms alone, {beside:+.2f} ms beside a "
          f"{args.large_mb} MiB request")
    print(json.dumps(summary))


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
