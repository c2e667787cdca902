"""The shipper against the real broker: backfill, live follow, kill -9, refusals."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dsh_kafka.records import decode_kafka_record
from dsh_core.storage.framing import compress_frame
from dsh_core.storage.layout import log_path
from producers.simulator import SimulatorConfig, simulate_session
from tests.conftest import corpus_logs
from tests.kafka_fixtures import consume_all, end_offsets
from tests.layout_helpers import place, storage_lines

from tests.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.kafka


def _ship_command(kafka, names, root: Path, state: Path, *extra: str) -> list[str]:
    prefix = names.events[: -len("dsh.session-events")]
    return [sys.executable, "-m", "dsh_pipeline.cli", "ship", "--root", str(root), "--state", str(state),
            "--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "4", "--poll", "0.05", *extra]


def _checkpointed(state: Path) -> dict[str, dict]:
    """The positions of the one destination the state was shipped to."""
    [destination] = json.loads((state / "shipper-checkpoints.json").read_text())["destinations"]
    return destination["files"]


def _shipped_seq_total(state: Path) -> int:
    try:
        files = _checkpointed(state)
    except (OSError, ValueError):
        return 0
    return sum(entry["next_seq"] for entry in files.values())


def _records_in_topic(kafka, topic: str) -> int:
    return sum(asyncio.run(end_offsets(kafka, topic)).values())




class LiveWriter(threading.Thread):
    """Appends simulated sessions to files batch by batch, as dsh does."""

    def __init__(self, root: Path, count: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.sessions = []
        config = SimulatorConfig(sessions=count, seed=5, min_turns=3, max_turns=6)
        for index in range(count):
            truth, batches = simulate_session(config, index)
            self.sessions.append((index % 2 and "zstd" or "none", list(batches)))
        self.expected: dict[str, bytes] = {}
        self.paths: dict[str, Path] = {}
        self.done = threading.Event()

    def run(self) -> None:
        pace = threading.Event()
        cursors = [0] * len(self.sessions)
        while any(c < len(b) for c, (_, b) in zip(cursors, self.sessions)):
            for i, (compression, batches) in enumerate(self.sessions):
                if cursors[i] >= len(batches):
                    continue
                batch = batches[cursors[i]]
                cursors[i] += 1
                self._append(compression, batch)
                pace.wait(0.01)  # wait-ok: pacing the writer, not synchronizing
        self.done.set()

    def _append(self, compression: str, batch) -> None:
        if not batch:
            return
        header = next((r for r in batch if r.kind == "header"), None)
        lines = b"".join(r.value + b"\n" for r in batch if r.kind == "record")
        if header is not None:
            session_id = header.session_id
            cwd = json.loads(header.value)["cwd"]
            path = log_path(self.root, cwd, session_id, compression)
            path.parent.mkdir(parents=True, exist_ok=True)
            head = header.value + b"\n"
            path.write_bytes(compress_frame(head) if compression == "zstd" else head)
            self.expected[session_id] = head
            self.paths[session_id] = path
        else:
            session_id = batch[0].session_id
            path = self.paths[session_id]
        if not lines:
            return
        self.expected[session_id] += lines
        with open(path, "ab") as stream:
            stream.write(compress_frame(lines) if compression == "zstd" else lines)


def test_kill_nine_resume_loses_nothing_and_repeats_exactly(kafka, topics, tmp_path):
    names = topics(partitions=4)
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    sources: dict[str, bytes] = {}
    for i, log in enumerate(corpus_logs("dsh-real")[:40]):
        data = log.read_bytes()
        place(root, data, "zstd" if i % 3 == 0 else "none")
        sources[json.loads(data.split(b"\n", 1)[0])["id"]] = data
    v4 = root / "--home-dev-new--" / "v4-session" / "session.jsonl.zstd"
    v4.parent.mkdir(parents=True)
    v4.write_bytes(compress_frame(b'{"type":"session","version":4,"id":"v4-session","createdAt":1}\n')
                   + compress_frame(b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}\n'))
    backlog = SimulatorConfig(sessions=120, seed=9, min_turns=3, max_turns=6)
    for index in range(backlog.sessions):  # a backlog big enough to kill the first pass midway
        _, batches = simulate_session(backlog, index)
        records = [r for batch in batches for r in batch]
        log = b"".join(r.value + b"\n" for r in records if r.kind in ("header", "record"))
        place(root, log, "zstd" if index % 2 else "none")
        sources[records[0].session_id] = log
    writer = LiveWriter(root, 30)
    rng = random.Random(20261202)
    kills = 0
    stderr_log = tmp_path / "shipper.err"
    with open(stderr_log, "ab") as errors:
        # kill 1: records are in Kafka but no checkpoint was written yet
        shipper = subprocess.Popen(_ship_command(kafka, names, root, state), stderr=errors)
        try:
            wait_for(lambda: _records_in_topic(kafka, names.events) > 500, 120, "the first records in Kafka")
        finally:
            os.kill(shipper.pid, signal.SIGKILL)
            shipper.wait()
        kills += 1
        assert _shipped_seq_total(state) == 0, "the kill was meant to land before the first checkpoint"
        writer.start()
        while kills < 4:  # kills 2-4: at random points while sessions grow
            shipper = subprocess.Popen(_ship_command(kafka, names, root, state), stderr=errors)
            try:
                target = _shipped_seq_total(state) + rng.randint(50, 600)
                wait_for(lambda: _shipped_seq_total(state) >= target or writer.done.is_set(), 120, "shipper progress")
            finally:
                os.kill(shipper.pid, signal.SIGKILL)
                shipper.wait()
            kills += 1
        writer.join(120)
        assert writer.done.is_set()
        final = subprocess.run(_ship_command(kafka, names, root, state, "--once"), stderr=errors, timeout=300)
    assert final.returncode == 1  # the v4 header in a v0-named file was refused
    sources.update(writer.expected)
    report = stderr_log.read_text()
    assert "FormatUnsupportedError" in report and str(v4) in report and "header identifies v4" in report

    expected_records = sum(1 + len(storage_lines(log)) for log in sources.values())
    records = asyncio.run(consume_all(kafka, names.events, expected_records, timeout=120))
    by_session: dict[str, list] = collections.defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_session[record.key.decode()].append(decode_kafka_record(record))
    assert set(by_session) == set(sources), "every session shipped, the misnamed one not"
    repeats = 0
    for session_id, received in by_session.items():
        seen: dict[tuple[str, int], bytes] = {}
        ordered = []
        for record in received:
            key = (record.kind, record.seq)
            if key in seen:
                assert seen[key] == record.value, f"{session_id}: a repeat of seq {record.seq} differs"
                repeats += 1
                continue
            seen[key] = record.value
            ordered.append(record)
        log = sources[session_id]
        assert ordered[0].kind == "header" and ordered[0].value == log.split(b"\n", 1)[0]
        assert [r.value for r in ordered[1:]] == storage_lines(log), f"{session_id}: stream differs from its file"
    assert repeats > 500  # at least what the first kill made the shipper send again
    print(f"kills={kills} records={len(records)} exact repeats={repeats}")


def test_torn_tail_waits_and_bad_file_is_reported(kafka, topics, tmp_path):
    names = topics(partitions=4)
    root, state = tmp_path / "root", tmp_path / "state"
    good = corpus_logs("dsh-real")[5].read_bytes()
    lines = good.split(b"\n")
    torn = place(root, b"\n".join(lines[:4]) + b"\n" + lines[4][:20], "none")
    bad_log = corpus_logs("dsh-real")[6].read_bytes().split(b"\n")
    bad_log[3] = b'{"type":"turn/start","seq":999,"time":1,"data":{"turn":1}}'
    bad = place(root, b"\n".join(bad_log), "none")
    bad_id = json.loads(bad_log[0])["id"]
    both = corpus_logs("dsh-real")[7].read_bytes()  # one session in both encodings: refused, never shipped
    place(root, both, "none")
    both_directory = place(root, both, "zstd").parent
    done = subprocess.run(_ship_command(kafka, names, root, state, "--once"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"SequenceGapError: session {bad_id!r}: expected seq 2, got 999 at {bad}: line 4" in done.stderr
    assert f"{both_directory}: holds both session.jsonl and session.jsonl.zstd" in done.stderr
    records = [decode_kafka_record(r) for r in asyncio.run(consume_all(kafka, names.events, 4 + 3, timeout=30))]
    torn_id = json.loads(lines[0])["id"]
    assert [r.kind for r in records if r.session_id == torn_id] == ["header", "record", "record", "record"]
    with open(torn, "ab") as stream:  # the writer completes the record
        stream.write(lines[4][20:] + b"\n")
    again = subprocess.run(_ship_command(kafka, names, root, state, "--once"), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 1, "a log refused by the pass before is still not shipped"
    assert f"refused earlier, not shipped: session {bad_id!r}: expected seq 2, got 999" in again.stderr
    more = [decode_kafka_record(r) for r in asyncio.run(consume_all(kafka, names.events, 4 + 3 + 1, timeout=30,
                                                                    settle=1))]
    assert [r.value for r in more if r.session_id == torn_id][-1] == lines[4]
    assert {r.session_id for r in more} == {torn_id, json.loads(bad_log[0])["id"]}


def test_a_repaired_log_ships_and_another_topic_prefix_ships_the_root_from_the_start(kafka, topics, tmp_path):
    names, other = topics(partitions=4), topics(partitions=4)
    root, state = tmp_path / "root", tmp_path / "state"
    good = corpus_logs("dsh-real")[6].read_bytes()
    broken = good.split(b"\n")
    broken[3] = b'{"type":"turn/start","seq":999,"time":1,"data":{"turn":1}}'
    log = place(root, b"\n".join(broken), "none")
    session_id = json.loads(broken[0])["id"]

    def ship(to, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(_ship_command(kafka, to, root, state, "--once", *extra), capture_output=True, text=True,
                              timeout=120)

    refused = ship(names)
    assert refused.returncode == 1 and f"expected seq 2, got 999 at {log}: line 4" in refused.stderr
    unchanged = ship(names)
    assert unchanged.returncode == 1 and "refused earlier, not shipped" in unchanged.stderr
    log.write_bytes(good)  # repaired
    repaired = ship(names)
    assert repaired.returncode == 0, repaired.stderr
    assert f"{log}: changed since it was refused: read again from byte " in repaired.stderr
    expected = 1 + len(storage_lines(good))
    records = [decode_kafka_record(r) for r in asyncio.run(consume_all(kafka, names.events, expected, settle=1))]
    assert [r.value for r in records if r.kind == "record"] == storage_lines(good)

    elsewhere = ship(other)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert f"nothing shipped to topic {other.events} of cluster " in elsewhere.stderr
    assert "(the checkpoints of 1 other destination(s) are kept)" in elsewhere.stderr
    assert len(asyncio.run(consume_all(kafka, other.events, expected, settle=1))) == expected
    back = ship(names)
    assert back.returncode == 0 and "pass done: 1 sessions, 0 records" in back.stderr
    assert {r.session_id for r in records} == {session_id}


def _big_raw_session(root: Path, megabytes: int) -> Path:
    """One long generated session (``benchmarks.bigsession``), a raw log in dsh's layout."""
    from benchmarks.bigsession import write_big_session

    work = root.parent / "big.jsonl"
    write_big_session(work, megabytes << 20)
    with open(work, "rb") as log:
        header = json.loads(log.readline())
    path = log_path(root, header["cwd"], header["id"], "none")
    path.parent.mkdir(parents=True)
    work.rename(path)
    return path


def test_sigint_stops_a_backfill_within_a_second_with_the_checkpoint_of_what_was_sent(kafka, topics, tmp_path):
    names = topics(partitions=4)
    root, state = tmp_path / "root", tmp_path / "state"
    big = _big_raw_session(root, 48)
    stderr_log = tmp_path / "shipper.err"
    with open(stderr_log, "wb") as errors:
        shipper = subprocess.Popen(_ship_command(kafka, names, root, state, "--once"), stderr=errors)
        try:
            wait_for(lambda: _records_in_topic(kafka, names.events) > 2000, 120, "the first records in Kafka")
            shipper.send_signal(signal.SIGINT)
            interrupted = time.monotonic()
            wait_for(lambda: "the checkpoint holds every record sent" in stderr_log.read_text(), 30, "the stop")
            stopped_in = time.monotonic() - interrupted  # checkpoint saved, then said
            status = shipper.wait(30)
        finally:
            shipper.kill()
    said = stderr_log.read_text()
    assert status == 130 and stopped_in < 1, f"exit {status}, stopped {stopped_in:.2f} s after SIGINT:\n{said}"
    [position] = _checkpointed(state).values()
    assert 0 < position["offset"] < big.stat().st_size
    shipped = [decode_kafka_record(r) for r in asyncio.run(consume_all(kafka, names.events, position["lines"]))]
    assert [r.value for r in shipped[1:position["lines"]]] == storage_lines(big.read_bytes()[:position["offset"]])

    done = subprocess.run(_ship_command(kafka, names, root, state, "--once"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "pass done: 1 sessions" in done.stderr
    lines = storage_lines(big.read_bytes())
    records = asyncio.run(consume_all(kafka, names.events, _records_in_topic(kafka, names.events), timeout=120))
    by_seq = {(r.kind, r.seq): r.value for r in map(decode_kafka_record, records)}  # repeats are exact
    assert [value for (kind, _), value in sorted(by_seq.items()) if kind == "record"] == lines
    print(f"stopped {stopped_in:.2f} s after SIGINT at byte {position['offset']} of {big.stat().st_size}")


def test_following_says_a_summary_and_a_stop_is_not_a_failure_after_refusals(kafka, topics, tmp_path):
    names = topics(partitions=4)
    root, state = tmp_path / "root", tmp_path / "state"
    place(root, corpus_logs("dsh-real")[5].read_bytes(), "none")
    bad_log = corpus_logs("dsh-real")[6].read_bytes().split(b"\n")
    bad_log[3] = b'{"type":"turn/start","seq":999,"time":1,"data":{"turn":1}}'
    place(root, b"\n".join(bad_log), "none")
    stderr_log = tmp_path / "shipper.err"
    with open(stderr_log, "wb") as errors:
        shipper = subprocess.Popen(_ship_command(kafka, names, root, state, "--summary-every", "0.2"), stderr=errors)
        try:
            wait_for(lambda: f"following {root}: 2 sessions" in stderr_log.read_text(), 120, "a summary line")
            shipper.send_signal(signal.SIGTERM)
            status = shipper.wait(30)
        finally:
            shipper.kill()
    said = stderr_log.read_text()
    assert status == 0, said  # a service manager stopping the shipper reads a clean stop
    assert "refused SequenceGapError" in said
    assert said.splitlines()[-1].startswith("dsh-pipeline ship: stopped: 2 sessions")


def test_a_flat_folder_of_logs_is_refused_by_name_and_laid_out_on_request(kafka, topics, tmp_path):
    names = topics(partitions=4)
    flat, root, state = tmp_path / "exported", tmp_path / "root", tmp_path / "state"
    flat.mkdir()
    logs = [log for log in corpus_logs("dsh-real")[:6]]
    for log in logs:
        (flat / log.name).write_bytes(log.read_bytes())
    refused = subprocess.run(_ship_command(kafka, names, flat, state, "--once"), capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1
    assert (f"refused LayoutError: {flat / logs[0].name}: a session log directly in the sessions root; dsh keeps "
            "each session at <root>/<project>/<session-id>/session[.vN].jsonl[.zstd] (lay logs out with "
            "`dsh-pipeline ship --layout-from FILE... --root ROOT`)") in refused.stderr
    assert "pass done: 0 sessions, 0 records (0 events) shipped, 6 refused" in refused.stderr

    shipped = subprocess.run(_ship_command(kafka, names, root, state, "--once", "--layout-from", str(flat)),
                             capture_output=True, text=True, timeout=120)
    assert shipped.returncode == 0, shipped.stderr
    assert f"laid out 6 session logs in {root} (0 were there already, 0 refused)" in shipped.stderr
    assert "pass done: 6 sessions" in shipped.stderr
    expected = sum(1 + len(storage_lines(log.read_bytes())) for log in logs)
    assert len(asyncio.run(consume_all(kafka, names.events, expected, timeout=60, settle=1))) == expected


_SHIP_RSS = """
import sys
from benchmarks import peak_rss_kb
from dsh_pipeline.cli import main
status = main(sys.argv[1:])
print(peak_rss_kb() // 1024, file=sys.stderr)
sys.exit(status)
"""


def test_a_session_of_large_records_ships_in_bounded_memory(kafka, topics, tmp_path):
    names = topics(partitions=4)
    root = tmp_path / "root"
    header = {"type": "session", "version": 0, "id": "wide", "createdAt": 1767225600000, "cwd": "/w",
              "delegationDepth": 0}
    path = log_path(root, "/w", "wide", "none")
    path.parent.mkdir(parents=True)
    text = "x" * (12 << 20)
    with open(path, "wb") as out:  # 48 records of 12 MiB: 576 MiB
        out.write(json.dumps(header).encode() + b"\n")
        for seq in range(48):
            out.write(json.dumps({"type": "user/message", "seq": seq, "time": 1767225600001 + seq,
                                  "data": {"id": f"u{seq}", "role": "user", "content": [{"type": "text", "text": text}]},
                                  "surfaceOp": "append"}).encode() + b"\n")
    command = _ship_command(kafka, names, root, tmp_path / "state", "--once")
    child = subprocess.run([sys.executable, "-c", _SHIP_RSS, *command[3:]], capture_output=True, text=True,
                           timeout=600, cwd=Path(__file__).parents[3])
    assert child.returncode == 0, child.stderr
    peak = int(child.stderr.split()[-1])
    assert peak <= 512, f"peak RSS {peak} MiB shipping a {path.stat().st_size >> 20} MiB session"
