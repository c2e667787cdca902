"""``dsh-pipeline kafka start --secure``: the local broker as a secured
cluster (SASL_SSL, a SCRAM user per service, ACLs per service), and the
whole pipeline (publisher, shipper, projector, auditor, archiver) run
through it with each service as its own user."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsh_kafka.errors import ClusterUnavailableError
from dsh_kafka.admin import end_offsets, prepare_topics
from dsh_kafka.config import KafkaConfig
from dsh_kafka.topics import TopicNames
from dsh_pipeline.config_file import KAFKA_KEYS
from dsh_pipeline.local_kafka import probe_metadata, read_state, stop_detached
from dsh_pipeline.secure_broker import USERS
from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, simulate_session
from tests.integration.consumers.projector.test_projector import run_until, views_match
from tests.conftest import corpus_logs, expected_of
from tests.kafka_fixtures import caught_up
from tests.layout_helpers import place
from tests.other_user import run_as_stranger, stranger
from tests.services import archiver, auditor, projector

pytestmark = pytest.mark.kafka


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, **(env or {})})


def test_each_service_runs_as_its_own_user_with_only_its_acls(tmp_path):
    data = tmp_path / "broker"
    started = _cli("kafka", "start", "--secure", "--data-dir", str(data))
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        secured = started.stdout.strip()
        assert f"each service's configuration: dsh-pipeline --config {data / 'clients'}/" in started.stderr
        files = {service: data / "clients" / f"{service}.toml" for service in USERS}
        assert all(f'bootstrap = "{secured}"' in path.read_text() for path in files.values())
        assert all(path.stat().st_mode & 0o077 == 0 for path in (data / "secrets").iterdir())
        again = _cli("kafka", "start", "--secure", "--data-dir", str(data))
        assert (again.returncode, again.stdout.strip()) == (0, secured)

        simulated = _cli("--config", str(files["publisher"]), "simulate", "--sessions", "12", "--seed", "71",
                         "--format", "0,3,4", "--manifest", str(tmp_path / "manifest.json"))
        assert simulated.returncode == 0, simulated.stderr[-2000:]
        root = tmp_path / "sessions"
        shipped = [log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"]][:3]
        for log in shipped:
            place(root, log.read_bytes(), "zstd")
        ship = _cli("--config", str(files["shipper"]), "ship", "--once", "--root", str(root))
        assert ship.returncode == 0, ship.stderr[-2000:]

        def as_user(service: str) -> KafkaConfig:  # the file's [kafka] table, as the command line reads it
            table = tomllib.loads(files[service].read_text())["kafka"]
            return KafkaConfig.from_env(None, {KAFKA_KEYS[key]: value for key, value in table.items()})

        names = TopicNames()
        truths = json.loads((tmp_path / "manifest.json").read_text())["truth"]

        async def run() -> None:
            ends = await end_offsets(as_user("projector"), names.events)
            services = [projector(as_user("projector"), names, "dsh-projector", tmp_path / "views.sqlite"),
                        auditor(as_user("auditor"), names, "dsh-auditor"),
                        archiver(as_user("archiver"), names, "dsh-archiver", tmp_path / "archive")]
            await asyncio.gather(*(run_until(s, lambda s=s: caught_up(s, ends)) for s in services))

        asyncio.run(run())
        assert views_match(tmp_path / "views.sqlite", [SimpleNamespace(**truth) for truth in truths.values()])
        assert len(list((tmp_path / "archive").glob("*/*/session*.jsonl.zstd"))) == len(truths) + len(shipped)

        async def write_events_as(service: str) -> None:
            truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=72), 0)
            async with Publisher(as_user(service), names) as publisher:
                for record in next(batches):
                    await publisher.send(record)
                await publisher.flush()

        with pytest.raises(ClusterUnavailableError, match="refused"):  # only a producer's user may write events
            asyncio.run(write_events_as("projector"))
        with pytest.raises(ClusterUnavailableError, match="cannot reach the Kafka cluster"):  # plaintext: refused
            asyncio.run(prepare_topics(KafkaConfig(secured), names, 2))
    finally:
        stop_detached(data)



def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on, as the kernel tells."""
    sockets = {link[len("socket:["):-1] for fd in os.listdir(f"/proc/{pid}/fd")
               if (link := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:[")}
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def _answers_without_credentials(port: int, ca: Path | None) -> bool:
    """Whether the listener on ``port`` answers a DescribeCluster request
    (an API brokers and controllers serve) sent before any login, in the
    clear or (``ca``) over TLS."""
    request = (struct.pack(">hhih", 60, 1, 7, 5) + b"probe\x00"  # header v2: key, version, correlation id, client
               + b"\x00\x01\x00")  # no authorized operations, endpoint type broker, no tagged fields
    try:
        with contextlib.ExitStack() as stack:
            channel = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=15))
            if ca is not None:
                channel = stack.enter_context(ssl.create_default_context(cafile=ca).wrap_socket(
                    channel, server_hostname="127.0.0.1"))
            channel.sendall(struct.pack(">i", len(request)) + request)
            head = stack.enter_context(channel.makefile("rb")).read(8)
    except OSError:  # ssl.SSLError included: the handshake or the connection refused
        return False
    return len(head) == 8 and struct.unpack(">i", head[4:])[0] == 7


def test_no_listener_takes_a_client_without_credentials_and_no_other_user_reads_the_data(tmp_path):
    outer = Path(tempfile.mkdtemp(prefix="dsh-secure-"))  # a folder every user may pass through, as a home is
    outer.chmod(0o755)
    data = outer / "broker"
    stranger()  # skips, saying why, where no other user can be made
    started = _cli("kafka", "start", "--secure", "--data-dir", str(data))
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        state = read_state(data)
        ca = data / "secrets" / "ca.pem"
        ports = _listening_ports(state.pid)
        assert len(ports) >= 2 and int(state.secured_bootstrap.rpartition(":")[2]) in ports  # clients', controller's
        assert {port: (_answers_without_credentials(port, None), _answers_without_credentials(port, ca))
                for port in ports} == dict.fromkeys(ports, (False, False))
        assert probe_metadata(state.client())  # the admin's login, from its 0600 password file, is served
        password = (data / "secrets" / "dsh-admin.password").read_text().strip()
        assert state.admin["DSH_KAFKA_SASL_PASSWORD_FILE"] == str(data / "secrets" / "dsh-admin.password")
        assert password not in Path(f"/proc/{state.pid}/cmdline").read_text()
        assert password not in (data / "broker-state.json").read_text()

        everything = [data, *data.rglob("*")]
        assert [path for path in everything if path.stat().st_mode & 0o077] == []  # segments and state included
        assert [path for path in everything if path.is_file() and b"PRIVATE KEY" in path.read_bytes()] == [
            data / "secrets" / "broker-keystore.pem"]  # the CA's key is nowhere beside the broker
        segment = next(data.glob("logs/*/00000000000000000000.log"))
        for argv in (["ls", str(data)], ["cat", str(data / "broker-state.json")], ["cat", str(segment)]):
            refused = run_as_stranger(argv)
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, (argv, refused)
        assert run_as_stranger(["ls", str(outer)]).returncode == 0  # the refusal is the data folder's own
    finally:
        stop_detached(data)
        shutil.rmtree(outer, ignore_errors=True)
