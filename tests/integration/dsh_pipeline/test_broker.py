"""The local broker: starts, serves, verifies topics, leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.local_kafka import LocalKafka, probe_metadata, sweep_abandoned_data_dirs
from dsh_kafka.topics import TopicNames
from dsh_kafka.admin import prepare_topics

from tests.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.kafka


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True




def test_broker_dies_with_a_crashed_caller_and_its_folder_is_swept(tmp_path):
    script = ("import sys\nfrom dsh_pipeline.local_kafka import LocalKafka\n"
              "broker = LocalKafka(heap='512m')\nbroker.start()\n"
              "print(broker.process.pid, broker.bootstrap, broker.data_dir, flush=True)\nsys.stdin.read()\n")
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as caller:
        pid_text, bootstrap, data_dir = caller.stdout.readline().split()
        broker_pid = int(pid_text)
        assert probe_metadata(bootstrap)
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    wait_for(lambda: not _alive(broker_pid) or _zombie(broker_pid), 60, "the orphaned broker to exit")
    # the killed caller could not remove its temporary folder: the next broker's start-up does
    assert Path(data_dir).is_dir()
    assert Path(data_dir) in sweep_abandoned_data_dirs()
    assert not Path(data_dir).exists()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1].startswith("Z")
    except OSError:
        return False


def test_missing_java_or_maven_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # cold cache: Maven is asked first
    with pytest.raises(PipelineError, match=r"mvn not found on PATH: it is needed to fetch the Kafka broker jars"):
        LocalKafka(tmp_path / "data").start()


def test_cli_detached_broker_start_status_stop(tmp_path):
    data = tmp_path / "broker"
    run = lambda *a: subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "kafka", *a, "--data-dir", str(data)],
                                    capture_output=True, text=True, timeout=120)
    started = run("start")
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip()
    assert probe_metadata(bootstrap)
    status = run("status")
    assert status.returncode == 0 and bootstrap in status.stdout
    assert run("start").stdout.strip() == bootstrap  # idempotent
    assert run("stop").stdout.strip() == "stopped"
    assert run("status").returncode == 1
    assert not probe_metadata(bootstrap)
    again = run("start")  # the same folder keeps its address: pinned clients go on
    try:
        assert again.returncode == 0 and again.stdout.strip() == bootstrap, again.stderr
    finally:
        assert run("stop").stdout.strip() == "stopped"


def test_topic_setup_is_idempotent_and_checks_existing_topics(kafka, topics):
    names = topics(partitions=3)
    asyncio.run(prepare_topics(kafka, names, 3))  # again: fine
    with pytest.raises(PipelineError, match=rf"topic {names.events} exists with 3 partitions, expected 5"):
        asyncio.run(prepare_topics(kafka, names, 5))
    fresh = TopicNames.with_prefix(names.events + ".x.")
    asyncio.run(prepare_topics(kafka, fresh, 2))


def test_topics_are_only_verified_when_creating_is_not_ours(kafka, topics):
    fresh = TopicNames.with_prefix(f"nocreate{os.getpid()}.")
    with pytest.raises(PipelineError, match=rf"topic {fresh.events} does not exist \(or this client may not see it\) "
                                            r"and topics are not created here \(--no-create-topics\): create it with "
                                            r"3 partitions and \{.*'compression.type': 'uncompressed'"):
        asyncio.run(prepare_topics(kafka, fresh, 3, create=False))
    names = topics(partitions=3)
    asyncio.run(prepare_topics(kafka, names, 3, create=False))  # existing and right: verified


def test_the_local_broker_takes_the_port_it_is_given_or_names_it_taken(tmp_path):
    import socket
    run = lambda *a: subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "kafka", *a], capture_output=True,
                                    text=True, timeout=120)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        taken = run("start", "--data-dir", str(tmp_path / "a"), "--port", str(port))
    assert taken.returncode == 1 and taken.stderr == (
        f"dsh-pipeline kafka: PipelineError: 127.0.0.1:{port} is in use: the broker needs another port\n")
    for _ in range(3):  # another process may take the free port between the probe and the start
        started = run("start", "--data-dir", str(tmp_path / "b"), "--port", str(port))
        if "is in use" not in started.stderr:
            break
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    try:
        assert started.returncode == 0 and started.stdout.strip() == f"127.0.0.1:{port}", started.stderr
    finally:
        assert run("stop", "--data-dir", str(tmp_path / "b")).stdout.strip() == "stopped"
