"""The inspect command: summaries, JSON lines, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dsh_core.session_header import SessionHeader
from dsh_core.storage.records import encode_records


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *args], capture_output=True, text=True, check=False)


def write_log(path: Path, *events: dict, tail: bytes = b"") -> Path:
    header = SessionHeader(id="cli-1", createdAt=5, cwd="/w", delegationDepth=0).to_line() + b"\n"
    path.write_bytes(header + encode_records(list(events)) + tail)
    return path


def test_summary_of_a_good_log(tmp_path):
    log = write_log(tmp_path / "a.jsonl", {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
                    {"type": "turn/end", "seq": 1, "time": 2, "data": {"turn": 1, "reason": {"kind": "completed"}}})
    result = run("inspect", str(log))
    assert result.returncode == 0, result.stderr
    assert "session cli-1 (v0, none), 2 events, 1 turns, 0 steps, 0 requests" in result.stdout
    assert "turn ends: completed=1" in result.stdout


def test_refused_log_names_file_line_and_exit_code(tmp_path):
    log = write_log(tmp_path / "bad.jsonl", {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
                    tail=b'{"type":"x","seq":5,"time":1,"data":{}}\n'
                         b'{"type":"turn/end","seq":1,"time":1,"data":{"turn":1,"reason":{"kind":"completed"}}}\n')
    result = run("inspect", str(log))
    assert result.returncode == 1
    assert "REFUSED [corrupt-storage] CorruptionError" in result.stdout
    assert f"{log}: line 3: seq gap in committed region (expected 1, got 5)" in result.stdout
    assert "Traceback" not in result.stderr
    as_json = json.loads(run("inspect", "--json", str(log)).stdout)
    assert as_json["accepted"] is False and as_json["error"]["category"] == "corrupt-storage"


def test_missing_file_and_directory_input(tmp_path):
    result = run("inspect", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 1 and "cannot read" in result.stderr and "Traceback" not in result.stderr
    folder = tmp_path / "root" / "--w--" / "cli-1"
    folder.mkdir(parents=True)
    write_log(folder / "session.jsonl", {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}})
    listed = run("inspect", "--json", str(tmp_path / "root"))
    report = json.loads(listed.stdout)
    assert report["accepted"] and report["repair"]["closerCount"] == 1


def test_an_unreachable_cluster_is_named_not_a_traceback(tmp_path):
    done = run("project", "--bootstrap", "127.0.0.1:1", "--wait-for-cluster", "0", "--store", str(tmp_path / "views.sqlite"))
    err = done.stderr
    assert done.returncode == 69 and "Traceback" not in err, err  # EX_UNAVAILABLE
    assert ("dsh-pipeline project: BrokerAbsentError: cannot reach the Kafka cluster at 127.0.0.1:1 over PLAINTEXT: no "
            "broker at the bootstrap address (127.0.0.1:1: nothing listens there (connection refused))") in err
    assert "`dsh-pipeline kafka start`" in err
    unresolved = run("project", "--bootstrap", "no-such-host.invalid:9092", "--wait-for-cluster", "2", "--store",
                     str(tmp_path / "views.sqlite"))
    assert unresolved.returncode == 69 and "Traceback" not in unresolved.stderr, unresolved.stderr
    assert "(no-such-host.invalid:9092: the name does not resolve)" in unresolved.stderr
    assert "does not resolve): check the address, or start a local broker with `dsh-pipeline kafka start`; trying " \
           "again for up to 2 s" in unresolved.stderr  # a broker still starting is waited for, then named


def test_kafka_start_nodes_refuses_what_it_cannot_start_by_name(tmp_path):
    secure = run("kafka", "start", "--nodes", "3", "--secure", "--data-dir", str(tmp_path / "a"))
    assert secure.returncode == 1 and "Traceback" not in secure.stderr, secure.stderr
    assert "--nodes starts a plaintext cluster on ports of its own: it takes no --secure or --port" in secure.stderr
    single = tmp_path / "single"
    (single / "logs").mkdir(parents=True)  # a single broker's folder
    done = run("kafka", "start", "--nodes", "3", "--data-dir", str(single))
    assert done.returncode == 1 and f"{single} holds a single broker: give the cluster another --data-dir" in done.stderr
    other = tmp_path / "two"
    other.mkdir()
    (other / "cluster.json").write_text(json.dumps({"nodes": [str(other / "node-1"), str(other / "node-2")]}))
    done = run("kafka", "start", "--nodes", "3", "--data-dir", str(other))
    assert done.returncode == 1 and f"{other} holds a cluster of 2 nodes, not 3: give another --data-dir" in done.stderr


def test_each_command_names_its_kafka_clients(monkeypatch):
    from dsh_pipeline.runtime import resolve_kafka
    monkeypatch.delenv("DSH_KAFKA_BOOTSTRAP", raising=False)
    kafka = resolve_kafka("broker-1:9092,broker-2:9092", "dsh-pipeline-project")
    assert (kafka.bootstrap, kafka.client_id) == ("broker-1:9092,broker-2:9092", "dsh-pipeline-project")


def test_shipper_mistakes_are_named_before_the_cluster_is_asked(tmp_path):
    root = tmp_path / "root"
    (root / ".dsh-shipper").mkdir(parents=True)
    (root / ".dsh-shipper" / "shipper-checkpoints.json").write_text("{garbage")
    (tmp_path / "file").write_text("")
    for where, message in ((tmp_path / "missing", "the sessions root does not exist"),
                           (tmp_path / "file", "the sessions root is not a directory"),
                           (root, "not a shipper checkpoint file (DecodeError: JSON is malformed")):
        done = run("ship", "--once", "--root", str(where), "--bootstrap", "127.0.0.1:1")  # no broker there
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("dsh-pipeline ship: ") and message in done.stderr, done.stderr


def test_membership_options_reach_the_consumer(tmp_path):
    from consumers.projector import ProjectorConfig
    from dsh_kafka.config import KafkaConfig
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.cli import build_parser
    from dsh_pipeline.service_commands import service_config
    args = build_parser().parse_args(["project", "--store", str(tmp_path / "v.sqlite"), "--session-timeout", "45",
                                      "--instance-id", "host-1"])
    settings = service_config(args, ProjectorConfig, KafkaConfig("b:9092"), TopicNames(),
                              store=tmp_path / "v.sqlite").consumer_settings()
    assert (settings.session_timeout_ms, settings.heartbeat_interval_ms, settings.group_instance_id) == (
        45_000, 3_000, "host-1")
    assert build_parser().parse_args(["project", "--store", "v"]).session_timeout == 10  # the configuration's default


def test_the_acls_command_prints_what_the_acl_test_grants():
    done = run("acls", "--principal", "User:dsh", "--topic-prefix", "prod.")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 9
    assert ("kafka-acls.sh --bootstrap-server BROKER:9092 --add --allow-principal User:dsh --operation Write "
            "--topic 'prod.dsh.' --resource-pattern-type prefixed") in lines
    assert sum("--transactional-id 'dsh-'" in line for line in lines) == 2


def test_a_bug_is_reported_as_one_with_its_own_exit_code(monkeypatch, capsys):
    import dsh_pipeline.cli as cli
    import dsh_pipeline.reader_commands as reader_commands

    def broken(args):
        raise KeyError("no such thing")

    monkeypatch.setattr(reader_commands, "_view", broken)
    assert cli.main(["view", "some-session"]) == cli.EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith(
        "dsh-pipeline view: internal error (a bug, please report it with the traceback above): KeyError: 'no such thing'")


def test_a_session_format_the_simulator_cannot_write_is_a_usage_error():
    for value in ("2", "0,5", "four", ""):
        done = run("simulate", "--format", value, "--bootstrap", "127.0.0.1:1")  # refused before any client
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"argument --format: expected formats among 0, 3, 4 (e.g. 4 or 0,3,4), got {value!r}" in done.stderr


def test_the_jsonrpc_worker_needs_a_session_id_and_says_so(monkeypatch):
    monkeypatch.setenv("DEEPSEEK_API_KEY", "unused")
    done = run("worker", "--prompt", "hello", "--model-url", "http://127.0.0.1:1", "--bootstrap", "127.0.0.1:1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("dsh-pipeline worker: PipelineError: --session-id is required with --runtime "
                                  "jsonrpc"), done.stderr


def test_serve_names_a_missing_token_and_a_missing_store(tmp_path, monkeypatch):
    monkeypatch.delenv("DSH_API_TOKENS", raising=False)
    done = run("serve", "--store", str(tmp_path / "views.sqlite"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "the read API needs a token: --tokens-file FILE (one per line) or $DSH_API_TOKENS" in done.stderr
    tokens = tmp_path / "tokens"
    tokens.write_text("# the dashboard's\nabc123\n")
    tokens.chmod(0o600)
    done = run("serve", "--store", str(tmp_path / "views.sqlite"), "--tokens-file", str(tokens))
    assert done.returncode == 1 and "views.sqlite: no view store there" in done.stderr


def test_version_names_the_installed_distribution():
    import importlib.metadata

    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"dsh-pipeline {importlib.metadata.version('dsh-pipeline')}"


def test_ship_help_states_dsh_layout_and_how_to_lay_logs_out(monkeypatch):
    from dsh_pipeline.cli import build_parser

    monkeypatch.setenv("COLUMNS", "1000")  # one line per paragraph
    text = build_parser().commands["ship"].format_help()
    assert "dsh keeps each session at ROOT/<project>/<session-id>/session[.vN].jsonl[.zstd]" in text
    assert "--layout-from FILE [FILE ...]" in text and "130 stopped before the end" in text
