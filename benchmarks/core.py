"""dsh_core throughput against the reference, and inspect's memory.

    python -m benchmarks.core [--repeat-events N] [--big-mb MB]

1. Decode, validate and derive every corpus log the reference restores,
   repeated to at least N events (default 200k), with dsh_core's loader and,
   in the same run, with the reference npm package under Node (parse each
   line, decodeStorageRecord, Session.fromRestore, deriveMessages). Prints
   events/s of both and the ratio.
2. The same race on a generated 20 MB long session (mostly chunk rows).
2b. The v4 race: the logs the real 0.2.1rc2 runtime wrote
   (``tests/fixtures/dsh-0.2.1``), read with ``load_session`` and with dsh
   0.2.1rc2's own reader under Node 22 (``benchmarks/dsh_reader_race.mjs``).
3. Generates a session file of realistic mix (mostly streamed chunk rows, a
   long agent session that compacts its history) of --big-mb MB and reports
   the peak RSS of `dsh-pipeline inspect` on it; and a long v4 session of a
   fifth of that size (``benchmarks/bigsession_v4.py``), the same way.

The last line is one JSON object with the figures; ``ratio`` is the corpus one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsh_core.loader import load_session, load_session_bytes

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("DSH_CORPUS", ROOT / "tests" / "corpus"))
REFERENCE_DIR = Path(os.environ.get("DSH_REFERENCE_DIR", Path.home() / ".cache" / "dsh-pipeline" / "reference"))


def reference_run(paths: list[Path], repeat: int) -> dict:
    request = json.dumps({"op": "restoreFiles", "cases": [{"paths": [str(p) for p in paths], "repeat": repeat}]})
    done = subprocess.run(["node", str(ROOT / "tools" / "reference" / "driver.mjs")], input=request.encode(),
                          capture_output=True, check=True, env={**os.environ, "DSH_REFERENCE_DIR": str(REFERENCE_DIR)})
    return json.loads(done.stdout)[0]


def ours_run(blobs: list[bytes], repeat: int) -> tuple[int, float]:
    events = 0
    start = time.perf_counter()
    for _ in range(repeat):
        for blob in blobs:
            result = load_session_bytes(blob)
            if result.state is not None:
                result.state.messages()
            events += result.stored_count
    return events, time.perf_counter() - start


def throughput(min_events: int) -> dict:
    paths = sorted((CORPUS / "dsh-real").glob("*.jsonl"))
    probe = reference_run(paths, 1)
    usable = [p for p in paths if str(p) not in set(probe["refused"])]
    per_pass = probe["events"]
    repeat = max(1, -(-min_events // per_pass))
    blobs = [p.read_bytes() for p in usable]
    for blob in blobs:  # every usable log must load here too
        assert load_session_bytes(blob).accepted
    best_ours = best_ref = 0.0
    for _ in range(3):  # best of three, both sides alike
        events, seconds = ours_run(blobs, repeat)
        best_ours = max(best_ours, events / seconds)
        ref = reference_run(usable, repeat)
        best_ref = max(best_ref, ref["events"] / ref["seconds"])
    print(f"corpus: {len(usable)} logs the reference restores, {per_pass} events per pass, x{repeat} "
          f"= {per_pass * repeat} events")
    print(f"dsh_core : {best_ours:12,.0f} events/s")
    print(f"reference: {best_ref:12,.0f} events/s (Node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()})")
    print(f"ratio    : {best_ours / best_ref:.2f}x")
    return {"ours_events_per_s": round(best_ours), "reference_events_per_s": round(best_ref),
            "ratio": round(best_ours / best_ref, 3), "events_per_pass": per_pass, "repeat": repeat}


def long_session_ratio(megabytes: int) -> dict:
    """The same race on one generated long session (mostly chunk rows)."""
    from benchmarks.bigsession import write_big_session
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.jsonl"
        write_big_session(path, megabytes * 1_000_000)
        blob = path.read_bytes()
        events, seconds = min((ours_run([blob], 1) for _ in range(3)), key=lambda run: run[1])
        ref = min((reference_run([path], 1) for _ in range(3)), key=lambda run: run["seconds"])
    ours_rate, ref_rate = events / seconds, ref["events"] / ref["seconds"]
    print(f"long session ({megabytes} MB, {events:,} events): dsh_core {ours_rate:,.0f} events/s, "
          f"reference {ref_rate:,.0f} events/s, ratio {ours_rate / ref_rate:.2f}x")
    return {"long_session_ours_events_per_s": round(ours_rate), "long_session_reference_events_per_s": round(ref_rate),
            "long_session_ratio": round(ours_rate / ref_rate, 3)}


_MEASURED_INSPECT = """
import sys
from benchmarks import peak_rss_kb
from dsh_pipeline.cli import main
status = main(["inspect", sys.argv[1]])
print(peak_rss_kb(), file=sys.stderr)
sys.exit(status)
"""


def v4_ratio(repeat: int) -> dict:
    """Our v4 read (decode, validate, derive) against dsh's own reader, on
    the same files; best of three, both sides alike."""
    from tests.oracle import place_log
    from tests.oracle.extract import node_binary, node_modules, oracle_dir
    logs = sorted((ROOT / "tests" / "fixtures" / "dsh-0.2.1").glob("*.v4.jsonl.zstd"))
    folder = oracle_dir()
    with tempfile.TemporaryDirectory() as root:
        ids = [place_log(log, Path(root)) for log in logs]
        paths = sorted(Path(root).glob("*/*/session.v4.jsonl.zstd"))
        best_ours = best_dsh = 0.0
        for _ in range(3):
            events, start = 0, time.perf_counter()
            for _ in range(repeat):
                for path in paths:
                    result = load_session(path)
                    if result.state is not None:
                        result.state.messages()
                    events += result.event_count
            best_ours = max(best_ours, events / (time.perf_counter() - start))
            done = subprocess.run([str(node_binary(folder)), str(ROOT / "benchmarks" / "dsh_reader_race.mjs"),
                                   str(node_modules(folder)), root, str(repeat), *ids],
                                  capture_output=True, text=True, check=True)
            theirs = json.loads(done.stdout)
            best_dsh = max(best_dsh, theirs["events"] / theirs["seconds"])
    print(f"v4: {len(paths)} logs of the 0.2.1rc2 runtime x{repeat}: ours {best_ours:,.0f} events/s, "
          f"dsh 0.2.1rc2 under Node 22 {best_dsh:,.0f} events/s, ratio {best_ours / best_dsh:.2f}x")
    return {"v4_ratio": round(best_ours / best_dsh, 3)}


def long_v4_session_rss(megabytes: int) -> dict:
    """inspect's peak RSS on one long generated v4 session."""
    from benchmarks.bigsession_v4 import write_long_v4_session
    with tempfile.TemporaryDirectory() as tmp:
        stats = write_long_v4_session(Path(tmp), megabytes * 1_000_000)
        start = time.perf_counter()
        child = subprocess.run([sys.executable, "-c", _MEASURED_INSPECT, str(stats["path"])],
                               capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        if child.returncode != 0:
            raise SystemExit(f"inspect failed on the generated v4 file: {child.stdout}{child.stderr}")
        peak_kb = int(child.stderr.strip().splitlines()[-1])
    print(f"long v4 session: {stats['bytes'] / 1e6:.0f} MB, {stats['events']:,} events, {stats['turns']:,} turns, "
          f"inspect took {seconds:.1f} s, peak RSS {peak_kb / 1024:.0f} MB")
    return {"v4_session_mb": round(stats["bytes"] / 1e6), "v4_inspect_seconds": round(seconds, 1),
            "v4_inspect_peak_rss_mb": round(peak_kb / 1024)}


def big_session_rss(megabytes: int) -> dict:
    from benchmarks.bigsession import write_big_session
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.jsonl"
        stats = write_big_session(path, megabytes * 1_000_000)
        start = time.perf_counter()
        # The child reports its own peak RSS, so no other process is counted.
        child = subprocess.run([sys.executable, "-c", _MEASURED_INSPECT, str(path)],
                               capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        peak_kb = int(child.stderr.strip().splitlines()[-1]) if child.returncode == 0 else 0
        if child.returncode != 0:
            raise SystemExit(f"inspect failed on the generated file: {child.stdout}{child.stderr}")
    print(f"big session: {stats['bytes'] / 1e6:.0f} MB, {stats['events']:,} events "
          f"({stats['chunk_events']:,} chunks), inspect took {seconds:.1f} s, peak RSS {peak_kb / 1024:.0f} MB")
    print(child.stdout.strip())
    return {"big_session_mb": round(stats["bytes"] / 1e6), "big_session_events": stats["events"],
            "inspect_seconds": round(seconds, 1), "inspect_peak_rss_mb": round(peak_kb / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat-events", type=int, default=200_000)
    parser.add_argument("--big-mb", type=int, default=500)
    args = parser.parse_args()
    figures = throughput(args.repeat_events)
    figures |= long_session_ratio(20)
    figures |= v4_ratio(200)
    if args.big_mb > 0:
        figures |= big_session_rss(args.big_mb)
        figures |= long_v4_session_rss(args.big_mb // 5)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
