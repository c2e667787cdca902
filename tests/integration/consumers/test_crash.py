"""SIGKILL the projector and the auditor mid-run; restarts end exactly where
an uninterrupted run ends (views equal, no finding lost or repeated)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys

import pytest

from consumers.projector import ViewStore
from producers.simulator import FaultPlan, SimulatorConfig
from tests.integration.test_pipeline import check_views, expected_findings
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import consume_all, end_offsets, group_lag

from tests.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.kafka




def test_kill_nine_projector_and_auditor(kafka, topics, group_id, tmp_path):
    names = topics(partitions=6)
    faults = FaultPlan(unlogged=3, dropped=2, duplicate=2, lossless=2, unknown=2)
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=250, seed=44, max_turns=5,
                                                                     faults=faults, formats=(0, 3, 4))))
    prefix = names.events[: -len("dsh.session-events")]
    db = tmp_path / "views.sqlite"
    projector_group, auditor_group = group_id("projector"), group_id("auditor")
    total = asyncio.run(group_lag(kafka, names.events, projector_group))
    # small batches: many commits, so the kills land mid-run; small LRUs:
    # sessions go cold and come back from the stores across the kills
    common = ["--bootstrap", kafka.bootstrap, "--topic-prefix", prefix, "--partitions", "6", "--max-records", "500",
              "--hot-sessions", "60"]
    commands = {
        projector_group: [sys.executable, "-m", "dsh_pipeline.cli", "project", "--store", str(db), "--group",
                          projector_group, *common],
        auditor_group: [sys.executable, "-m", "dsh_pipeline.cli", "audit", "--state", str(tmp_path / "auditor.sqlite"),
                        "--checkpoint-seconds", "0.2", "--group", auditor_group, *common],
    }
    rng = random.Random(7)
    kills = collections.Counter()
    for group, command in commands.items():
        for _ in range(3):
            lag_before = asyncio.run(group_lag(kafka, names.events, group))
            if lag_before == 0:
                break
            target = lag_before - rng.randint(1, 200)  # kill soon after the first commits
            with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
                try:
                    wait_for(lambda: asyncio.run(group_lag(kafka, names.events, group)) <= target, 120,
                              f"{group} progress")
                finally:
                    os.kill(child.pid, signal.SIGKILL)
                    child.wait()
            kills[group] += 1
        with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
            try:
                wait_for(lambda: asyncio.run(group_lag(kafka, names.events, group)) == 0, 180, f"{group} to finish")
            finally:
                child.send_signal(signal.SIGTERM)
                child.wait(60)
    assert kills[projector_group] >= 3 and kills[auditor_group] >= 3, (kills, total)
    assert check_views(db, truths) == []
    # the compacted view-heads topic ends on every session's stored view
    ends = asyncio.run(end_offsets(kafka, names.views))
    heads = {}
    for record in sorted(asyncio.run(consume_all(kafka, names.views, sum(ends.values()), timeout=60)),
                         key=lambda r: (r.partition, r.offset)):
        heads[record.key.decode()] = json.loads(record.value)
    store = ViewStore(db)
    try:
        views = {truth.session_id: store.view(truth.session_id) for truth in truths}
    finally:
        store.close()
    assert {s: (h["seq"], h["status"], h["messagesDigest"]) for s, h in heads.items()} == {
        s: (v["nextSeq"], v["status"], v.get("messagesDigest")) for s, v in views.items()}
    expected = expected_findings(truths)
    records = asyncio.run(consume_all(kafka, names.findings, sum(expected.values()), timeout=60, settle=1.5,
                                      committed_only=True))
    got = collections.Counter((f["session"], f["rule"], f["seq"]) for f in map(lambda r: json.loads(r.value), records))
    assert got == expected, f"extra: {got - expected}, missing: {expected - got}"
