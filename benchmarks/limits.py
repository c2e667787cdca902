"""Peak memory under hostile input, as ratios to an honest baseline run the same way.

    python -m benchmarks.limits [--big-mb N] [--sessions N] [--bootstrap HOST:PORT] [--idle-only]

Every case runs in a process of its own, which reports its own peak RSS:

* the shipper (``dsh-pipeline ship --once``) on a root of one small honest
  session (the baseline), then on roots that add: ``--sessions`` sessions
  (default 100k); one session of ``--big-mb`` (default 2048) written as
  dsh writes zstd logs, a frame per append batch; the same size of 12 MiB
  records, raw; a 32 KB zstd file whose one frame inflates to 1 GiB (a
  bomb); a session with one 9 MiB line. ``inspect`` on the bomb. Each is
  checked against the stated bounds (a bomb: 256 MiB; any session: 512
  MiB). Then the time of a pass over the ``--sessions`` root once it was
  shipped, when nothing changed: one that reads the whole root (``--once``,
  or following where inotify cannot be had) and an idle pass of the
  follower (inotify: what changed only);
* a projector catching up on a partition of one honest session (the
  baseline), then on ones that also hold 8 and 64 records of the largest
  size the events topic takes, each of a session that never sends its
  header (so each is held: the most memory a record can take);
* the gateway (``dsh-pipeline gateway``, its own process tree: itself and its
  attesting workers) idle (the baseline), then while 16 clients each send a
  request of the largest body it takes (32 MiB) at once.

A record over the limit after decompression never reaches a consumer: the
events topic is stored uncompressed, so the broker refuses the batch
(``tests/integration/dsh_kafka/test_record_limits.py``). The last line is one JSON
object with all figures.
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
import uuid
from pathlib import Path
from typing import Sequence

import zstandard

from benchmarks import local_bootstrap, projector_peak_rss_mb
from benchmarks.bigsession import write_big_session
from dsh_core.jsonvalue import decode_json, encode_json
from dsh_core.storage.framing import compress_frame
from dsh_core.storage.layout import log_path
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.clients import make_producer
from dsh_kafka.config import BOOTSTRAP_ENV, SERVICE_PRODUCER, KafkaConfig
from dsh_kafka.records import KIND_RECORD, SessionRecord
from dsh_kafka.topics import MAX_MESSAGE_BYTES, TopicNames
from producers.simulator import SimulatorConfig, simulate_session

_SHIP = """
import sys
from benchmarks import peak_rss_kb
from dsh_pipeline.cli import main
status = main(["ship", "--once", "--root", sys.argv[1], "--bootstrap", sys.argv[2], "--topic-prefix", sys.argv[3],
               "--partitions", "1"])
print(peak_rss_kb(), file=sys.stderr)
sys.exit(status)
"""

def _honest_session(root: Path, session_id: str, extra: Sequence[bytes] = ()) -> None:
    """A small valid session as dsh writes it (a plain log), with ``extra``
    event lines after its own."""
    truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=3, min_turns=1, max_turns=1), 0)
    records = [r for batch in batches for r in batch if r.kind != "attestation"]
    header = decode_json(records[0].value) | {"id": session_id}
    lines = [encode_json(header)] + [r.value for r in records[1:]]
    seq = truth.next_seq
    for line in extra:
        lines.append(line.replace(b'"seq":0', f'"seq":{seq}'.encode(), 1))
        seq += 1
    path = log_path(root, header.get("cwd"), session_id, "none")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def _many_sessions(root: Path, count: int) -> None:
    header = {"type": "session", "version": 0, "id": "", "createdAt": 1767225600000, "cwd": "/w", "delegationDepth": 0}
    event = b'{"type":"user/message","seq":0,"time":1767225600001,"data":{"id":"u1","role":"user",' \
            b'"content":[{"type":"text","text":"hi"}]},"surfaceOp":"append"}\n'
    for index in range(count):
        session_id = f"many-{index:06d}"
        path = log_path(root, "/w", session_id, "none")
        path.parent.mkdir(parents=True)
        path.write_bytes(encode_json(header | {"id": session_id}) + b"\n" + event)


def _big_zstd_session(root: Path, megabytes: int, work: Path) -> int:
    plain = work / "big.jsonl"
    stats = write_big_session(plain, megabytes * 1024 * 1024)
    with open(plain, "rb") as source:
        header = source.readline()
        session = decode_json(header)
        path = log_path(root, session.get("cwd"), session["id"], "zstd")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            out.write(compress_frame(header))
            batch: list[bytes] = []
            for line in source:
                batch.append(line)
                if len(batch) == 200:  # an append batch
                    out.write(compress_frame(b"".join(batch)))
                    batch = []
            if batch:
                out.write(compress_frame(b"".join(batch)))
    plain.unlink()
    return stats["events"]


def _bomb(root: Path) -> int:
    header = encode_json({"type": "session", "version": 0, "id": "bomb", "createdAt": 1767225600000, "cwd": "/w", "delegationDepth": 0})
    line = b'{"type":"user/message","seq":0,"time":1,"data":{}}' + b" " * 4000 + b"\n"
    compressor = zstandard.ZstdCompressor(level=19, write_checksum=True).compressobj()
    frame = b"".join(compressor.compress(line * 1024) for _ in range(256)) + compressor.flush()  # 1 GiB
    path = log_path(root, "/w", "bomb", "zstd")
    path.parent.mkdir(parents=True)
    path.write_bytes(compress_frame(header + b"\n") + frame)
    return path.stat().st_size


def _long_line() -> bytes:
    text = "x" * (9 * 1024 * 1024)
    return encode_json({"type": "user/message", "seq": 0, "time": 1767225600999,
                        "data": {"id": "u-long", "role": "user", "content": [{"type": "text", "text": text}]},
                        "surfaceOp": "append"})


def _ship_rss(root: Path, bootstrap: str) -> float:
    """Peak RSS (MB) of one ``ship --once`` pass over ``root``."""
    prefix = f"lim{uuid.uuid4().hex[:6]}."
    child = subprocess.run([sys.executable, "-c", _SHIP, str(root), bootstrap, prefix], capture_output=True, text=True)
    if child.returncode not in (0, 1):  # 1: entries were refused and reported, as some cases intend
        raise SystemExit(f"ship failed on {root}:\n{child.stdout}{child.stderr}")
    return int(child.stderr.strip().splitlines()[-1]) / 1024


def _big_records_session(root: Path, megabytes: int) -> None:
    """A raw session of ``megabytes`` in records of 12 MiB (large tool results)."""
    text = "x" * (12 << 20)
    header = {"type": "session", "version": 0, "id": "big-records", "createdAt": 1767225600000, "cwd": "/w",
              "delegationDepth": 0}
    path = log_path(root, "/w", "big-records", "none")
    path.parent.mkdir(parents=True)
    with open(path, "wb") as out:
        out.write(encode_json(header) + b"\n")
        for seq in range(max(1, megabytes // 12)):
            out.write(encode_json({"type": "user/message", "seq": seq, "time": 1767225600001 + seq, "surfaceOp": "append",
                                   "data": {"id": f"u{seq}", "role": "user", "content": [{"type": "text", "text": text}]}})
                      + b"\n")


_INSPECT = """
import sys
from benchmarks import peak_rss_kb
from dsh_pipeline.cli import main
main(["inspect", sys.argv[1]])
print(peak_rss_kb(), file=sys.stderr)
"""


def _inspect_rss(path: Path) -> float:
    """Peak RSS (MB) of ``dsh-pipeline inspect`` on one file."""
    child = subprocess.run([sys.executable, "-c", _INSPECT, str(path)], capture_output=True, text=True)
    return int(child.stderr.strip().splitlines()[-1]) / 1024


#: The shipper's stated memory bounds (MiB of peak RSS).
BOMB_BOUND_MIB, SESSION_BOUND_MIB = 256, 512


def _check_bounds(figures: dict[str, float]) -> None:
    """Say whether each case kept its bound (figures are MB of 1 MiB)."""
    bounds = {"ship_bomb_mb": BOMB_BOUND_MIB, "inspect_bomb_mb": BOMB_BOUND_MIB, "ship_long-line_mb": SESSION_BOUND_MIB,
              "ship_many_mb": SESSION_BOUND_MIB, "ship_big_mb": SESSION_BOUND_MIB,
              "ship_big-records_mb": SESSION_BOUND_MIB}
    for name, bound in bounds.items():
        print(f"bound {name}: {figures[name]:.0f} <= {bound} MiB: {'held' if figures[name] <= bound else 'BROKEN'}")


_IDLE = """
import asyncio, sys, time
from pathlib import Path
from producers.shipper import Destination, Shipper, ShipperConfig

async def main(root, state):
    async def discard(record): pass
    async def flush(): pass
    for once in (True, False):  # reading the whole root, then following what changed
        with Shipper(ShipperConfig(Path(root), Path(state), once=once), discard, flush, lambda line: None,
                     say=lambda line: print(line, file=sys.stderr), destination=Destination("bench", "t")) as shipper:
            await shipper.ship_once()
            started = time.perf_counter()
            await shipper.ship_once()
            print(time.perf_counter() - started)

asyncio.run(main(*sys.argv[1:]))
"""


def _idle_pass_seconds(root: Path) -> tuple[float, float]:
    """Seconds of a second pass over ``root`` in one shipper (records go
    nowhere) when nothing changed: reading the whole root, and following it
    (inotify)."""
    with tempfile.TemporaryDirectory() as state:
        child = subprocess.run([sys.executable, "-c", _IDLE, str(root), state], capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(f"the idle pass failed:\n{child.stderr}")
    whole, following = (round(float(figure), 4) for figure in child.stdout.split()[-2:])
    return whole, following


def _idle_case(root: Path, sessions: int, figures: dict[str, float]) -> None:
    figures["whole_pass_s"], figures["idle_pass_s"] = _idle_pass_seconds(root)
    print(f"shipper, a pass over {sessions} sessions when nothing changed: {figures['whole_pass_s']:.2f} s reading "
          f"the whole root, {figures['idle_pass_s']:.4f} s following (inotify)", flush=True)


async def _fill_partition(kafka: KafkaConfig, names: TopicNames, junk: int) -> int:
    truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=4, min_turns=2, max_turns=2), 0)
    records = [r for batch in batches for r in batch]
    largest = MAX_MESSAGE_BYTES - 200
    records += [SessionRecord(f"junk-{i}", KIND_RECORD, 0, 1, os.urandom(largest)) for i in range(junk)]
    producer = make_producer(kafka, SERVICE_PRODUCER)
    await producer.start()
    try:
        for record in records:
            await producer.send(names.events, key=record.key, value=record.value, headers=record.headers,
                                partition=0)
        await producer.flush()
    finally:
        await producer.stop()
    return sum((await end_offsets(kafka, names.events)).values())


def _project_rss(kafka: KafkaConfig, junk: int) -> float:
    names = TopicNames.with_prefix(f"lim{uuid.uuid4().hex[:6]}.")
    asyncio.run(prepare_topics(kafka, names, 1))
    expected = asyncio.run(_fill_partition(kafka, names, junk))
    return projector_peak_rss_mb(kafka.bootstrap, names.events[:-len("dsh.session-events")], expected)


def _tree_peak_rss_kb(pid: int) -> int:
    """The summed peak RSS (``VmHWM``, KiB) of a process and its descendants."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(FileNotFoundError):
            with open(f"/proc/{current}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
    return total


def gateway_peak_rss(bootstrap: str, work: Path, clients: int = 16) -> dict[str, float]:
    """Peak RSS (MB) of the gateway's process tree, idle and under ``clients``
    concurrent requests of the largest body it takes, in front of the
    benchmark's upstream (which reads and drops request bodies)."""
    import httpx

    from benchmarks.gateway import CREDENTIAL, _free_port, _loadgen, _stop, _wait_listening
    from producers.gateway import GatewayConfig
    largest = GatewayConfig.max_body_bytes
    credentials = work / "gateway-credentials"
    credentials.touch(0o600)
    credentials.write_text(f"bench {CREDENTIAL}\n")
    upstream_port, gateway_port = _free_port(), _free_port()
    with contextlib.ExitStack() as stack:
        upstream = subprocess.Popen([str(_loadgen()), "upstream", str(upstream_port), "0"])
        stack.callback(_stop, upstream)
        gateway = subprocess.Popen([sys.executable, "-m", "dsh_pipeline.cli", "gateway", "--listen",
                                    f"127.0.0.1:{gateway_port}", "--upstream", f"http://127.0.0.1:{upstream_port}",
                                    "--credentials-file", str(credentials), "--bootstrap", bootstrap,
                                    "--topic-prefix", f"lim{uuid.uuid4().hex[:6]}.", "--log-level", "ERROR"])
        stack.callback(_stop, gateway)
        _wait_listening(upstream_port, upstream)
        _wait_listening(gateway_port, gateway)
        body = b'{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"' + b"x" * (largest - 100) + b'"}]}'

        async def send_all() -> list[int]:
            async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=clients)) as client:
                async def one(index: int) -> int:
                    try:
                        answer = await client.post(f"http://127.0.0.1:{gateway_port}/v1/messages", content=body,
                                                   headers={"x-dsh-gateway-credential": CREDENTIAL,
                                                            "x-deepseek-harness-session-id": f"large-{index}"})
                    except httpx.TransportError:  # refused and closed while the body was still being sent
                        return 503
                    return answer.status_code
                await one(-1)  # the first request through: connections and workers up
                idle = _tree_peak_rss_kb(gateway.pid)
                return [idle, *await asyncio.gather(*(one(index) for index in range(clients)))]

        idle, *statuses = asyncio.run(send_all())
        peak = _tree_peak_rss_kb(gateway.pid)
    return {"gateway_idle_mb": round(idle / 1024), f"gateway_{clients}x{largest >> 20}mib_mb": round(peak / 1024),
            "gateway_forwarded": statuses.count(200), "gateway_refused": statuses.count(503)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-mb", type=int, default=2048, help="size of the big session (MiB of plaintext)")
    parser.add_argument("--sessions", type=int, default=100_000, help="sessions in the many-sessions root")
    parser.add_argument("--bootstrap", default=os.environ.get(BOOTSTRAP_ENV))
    parser.add_argument("--idle-only", action="store_true",
                        help="only the shipper's passes over --sessions sessions when nothing changed (no broker)")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    if args.idle_only:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "many").mkdir()
            _many_sessions(Path(folder) / "many", args.sessions)
            _idle_case(Path(folder) / "many", args.sessions, figures)
        print(json.dumps({"sessions": args.sessions, **figures}))
        return
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or local_bootstrap(stack)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))

        def ship_case(name: str, prepare) -> None:
            root = work / name
            root.mkdir()
            _honest_session(root, f"honest-{name}")
            prepare(root)
            figures[f"ship_{name}_mb"] = round(_ship_rss(root, bootstrap))
            print(f"shipper, {name:>10}: peak RSS {figures[f'ship_{name}_mb']:6.0f} MB "
                  f"({figures[f'ship_{name}_mb'] / figures['ship_baseline_mb']:.2f}x the baseline)", flush=True)

        ship_case("baseline", lambda root: None)
        ship_case("bomb", _bomb)
        ship_case("long-line", lambda root: _honest_session(root, "long-line", [_long_line()]))
        ship_case("many", lambda root: _many_sessions(root, args.sessions))
        ship_case("big", lambda root: _big_zstd_session(root, args.big_mb, work))
        ship_case("big-records", lambda root: _big_records_session(root, args.big_mb))
        figures["inspect_bomb_mb"] = round(_inspect_rss(next((work / "bomb").glob("*/bomb/session.jsonl.zstd"))))
        print(f"inspect,       bomb: peak RSS {figures['inspect_bomb_mb']:6.0f} MB", flush=True)
        _check_bounds(figures)
        _idle_case(work / "many", args.sessions, figures)

        kafka = KafkaConfig(bootstrap)
        for junk in (0, 8, 64):
            name = f"project_{junk}_largest_mb"
            figures[name] = round(_project_rss(kafka, junk))
            print(f"projector, {junk:2} held records of {MAX_MESSAGE_BYTES >> 20} MiB: peak RSS {figures[name]:4.0f} MB "
                  f"({figures[name] / figures['project_0_largest_mb']:.2f}x the baseline)", flush=True)
        gateway = gateway_peak_rss(bootstrap, work)
        figures.update(gateway)
        print(f"gateway, idle then 16 requests of 32 MiB at once: peak RSS {gateway['gateway_idle_mb']} MB, then "
              f"{gateway['gateway_16x32mib_mb']} MB ({gateway['gateway_forwarded']} forwarded, "
              f"{gateway['gateway_refused']} refused at its body memory limit)", flush=True)
    print(json.dumps({"big_mb": args.big_mb, "sessions": args.sessions, **figures}))


if __name__ == "__main__":
    main()
