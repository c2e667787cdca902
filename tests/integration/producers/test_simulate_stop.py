"""``simulate`` stopped by SIGTERM or SIGINT: it stops within a record,
exits 130 and writes the manifest of what it sent, marked partial."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from dsh_kafka.admin import end_offsets
from dsh_kafka.records import KIND_RECORD, decode_kafka_record
from tests.kafka_fixtures import consume_all
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_simulation_writes_the_partial_manifest_of_what_it_sent(kafka, topics, tmp_path, signum):
    names = topics(partitions=4)
    manifest_path = tmp_path / "manifest.json"
    simulate = subprocess.Popen(
        [sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--sessions", "5000", "--seed", "9", "--manifest",
         str(manifest_path), "--bootstrap", kafka.bootstrap, "--topic-prefix", names.events[:-len("dsh.session-events")],
         "--partitions", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: simulate.poll() is not None or sum(asyncio.run(end_offsets(kafka, names.events)).values())
                 > 3000, 120, "records sent")
        simulate.send_signal(signum)
        stopped = time.monotonic()
        out, err = simulate.communicate(timeout=60)
        stopped_in = time.monotonic() - stopped
    finally:
        simulate.kill()
    assert simulate.returncode == 130, err
    manifest = json.loads(manifest_path.read_text())
    assert [path.name for path in tmp_path.iterdir()] == ["manifest.json"]  # no temporary file left
    assert manifest["partial"] is True and 0 < manifest["sessions"] < 5000
    assert out == (f"stopped: {manifest['sessions']} of 5000 sessions sent whole ({len(manifest['unfinished'])} "
                   f"cut short), {manifest['events']} events; partial manifest {manifest_path}\n")
    sent = sum(asyncio.run(end_offsets(kafka, names.events)).values())
    records = [decode_kafka_record(record) for record in asyncio.run(consume_all(kafka, names.events, sent))]
    ends: dict[str, int] = defaultdict(int)  # of each session sent, the seq after its last record
    for record in records:
        ends[record.session_id] = max(ends[record.session_id],
                                      record.seq + record.count if record.kind == KIND_RECORD else 0)
    assert {session: ends[session] for session in manifest["truth"]} == {
        session: truth["next_seq"] for session, truth in manifest["truth"].items()}  # each sent whole
    assert set(ends) == set(manifest["truth"]) | set(manifest["unfinished"])  # and nothing else sent
    print(f"stopped {stopped_in:.2f} s after {signum.name}: {manifest['sessions']} sessions whole, "
          f"{len(manifest['unfinished'])} cut short, {sent} records")
