"""The local broker's start-up, without starting it: what reaches a command line, and how the other
commands find it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import dsh_pipeline.local_kafka as local_kafka
from dsh_core.errors import PipelineError
from dsh_pipeline.local_kafka import LocalKafka

PASSWORD = 's3"cr\\et p'  # a quote, a backslash and a space: the argument file's escapes


def test_scram_credentials_go_through_a_private_argument_file_not_the_command_line(tmp_path, monkeypatch):
    runs: list[tuple[list[str], str, int]] = []

    def run(argv, **_):
        argfile = next((Path(a[1:]) for a in argv if a.startswith("@")), None)
        runs.append((argv, argfile.read_text() if argfile else "", argfile.stat().st_mode & 0o777 if argfile else 0))
        return subprocess.CompletedProcess(argv, 0, "" if argfile else "q1Zk1ZkjQ0Wm0xyz-AbCdE\n", "")

    monkeypatch.setattr(local_kafka.subprocess, "run", run)
    monkeypatch.setattr(local_kafka, "require_tool", lambda tool, purpose: "/usr/bin/java")
    LocalKafka(tmp_path, sasl_users={"dsh": PASSWORD})._format(Path("/opt/kafka/libs"), tmp_path / "server.properties")
    (_, _, _), (argv, arguments, mode) = runs
    assert not any(PASSWORD in a or "password" in a for a in argv)
    assert mode == 0o600 and not (tmp_path / "storage-format.args").exists()
    assert '"SCRAM-SHA-512=[name=dsh,password=s3\\"cr\\\\et p]"' in arguments.splitlines()


def test_an_argument_file_line_reads_back_as_the_argument_java_gets():
    assert local_kafka._java_argument('a"b\\c d') == '"a\\"b\\\\c d"'


def _state(data_dir: Path, bootstrap: str) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "broker-state.json").write_text(json.dumps(
        {"pid": 1, "bootstrap": bootstrap, "data_dir": str(data_dir), "log": str(data_dir / "broker.log")}))


def test_commands_find_the_broker_kafka_start_data_dir_started_while_the_default_one_does_not_run(
        tmp_path, monkeypatch):
    from dsh_pipeline import runtime
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DSH_KAFKA_BOOTSTRAP", raising=False)
    answering: set[str] = set()
    monkeypatch.setattr(runtime, "probe_metadata", lambda kafka: kafka.bootstrap in answering)
    default, elsewhere = runtime.default_broker_dir(), tmp_path / "elsewhere"
    _state(default, "127.0.0.1:9001")
    _state(elsewhere, "127.0.0.1:9002")
    with pytest.raises(PipelineError, match="no Kafka cluster: pass --bootstrap"):
        runtime.resolve_kafka(None, "c")
    runtime.remember_broker_dir(elsewhere)  # `kafka start --data-dir elsewhere`
    assert runtime.local_broker() == (default, None)  # while neither answers
    answering.add("127.0.0.1:9002")
    assert runtime.local_broker()[0] == elsewhere
    assert runtime.resolve_kafka(None, "c").bootstrap == "127.0.0.1:9002"
    answering.add("127.0.0.1:9001")  # the default folder's broker comes first
    assert runtime.resolve_kafka(None, "c").bootstrap == "127.0.0.1:9001"


def test_an_attached_broker_outlives_the_thread_that_started_it(tmp_path, monkeypatch):
    # Linux sends the parent-death signal when the thread that started a child ends: a node restarted from a
    # worker thread (asyncio.to_thread) was stopped as soon as that thread ended.
    monkeypatch.setattr(LocalKafka, "_format", lambda self, lib, properties: None)
    monkeypatch.setattr(LocalKafka, "_command", lambda self, lib, properties: [
        sys.executable, "-c", "import signal; signal.pause()"])  # a stand-in broker: runs until a signal
    broker = LocalKafka(tmp_path)
    starting = threading.Thread(target=broker.launch, args=(Path("/opt/kafka/libs"), 9092, 9093))
    starting.start()
    starting.join()
    assert broker.process is not None
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # a SIGTERM would end it at once
            broker.process.wait(1.0)
    finally:
        broker.process.kill()
        broker.process.wait()
