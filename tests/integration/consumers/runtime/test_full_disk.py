"""A store on a full disk stops its service with an error that says so and
names the file (exit 1: a state the operator fixes), never as a bug
(exit 70), and commits nothing past it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from producers.simulator import SimulatorConfig
from tests.integration.consumers.projector.test_projector import publish_fleet
from tests.kafka_fixtures import group_lag

pytestmark = pytest.mark.kafka


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs mounted for the test (skipped, saying why, where it
    cannot be: mounting needs root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_projector_whose_disk_is_full_says_so_naming_the_file(kafka, topics, group_id, small_disk):
    names = topics(partitions=1)
    asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=20, seed=78, max_turns=3)))
    store, group = small_disk / "views.sqlite", group_id("projector")
    command = [sys.executable, "-m", "dsh_pipeline.cli", "project", "--store", str(store), "--group", group,
               "--bootstrap", kafka.bootstrap, "--topic-prefix", names.events[: -len("dsh.session-events")],
               "--partitions", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert (f"dsh-pipeline project: StateStoreError: {store}: the disk holding the view-store file is full; "
            "nothing of this transaction was written") in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    total = asyncio.run(group_lag(kafka, names.events, group))
    assert total > 0  # the batch the disk refused was not committed
