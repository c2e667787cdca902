"""The operations server: routes, health answers, bind errors, port release."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter

from consumers.runtime import ServiceState
from dsh_core.errors import PipelineError
from dsh_pipeline.ops_server import consumers_health, serve_ops

HOST = "127.0.0.1"


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of ``GET path`` (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


class Switch:
    """A health check the test flips."""

    def __init__(self) -> None:
        self.ok, self.detail = True, "all good"

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.detail


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("ops_test_requests", "A counter only this test registers.", registry=registry).inc(3)
    return registry


def test_metrics_serves_the_given_registry(registry: CollectorRegistry) -> None:
    with serve_ops(HOST, 0, Switch(), registry) as server:
        assert server.port != 0
        status, body = get(server.port, "/metrics")
    assert status == 200
    assert "ops_test_requests_total 3.0" in body


def test_healthz_follows_the_check(registry: CollectorRegistry) -> None:
    check = Switch()
    with serve_ops(HOST, 0, check, registry) as server:
        assert get(server.port, "/healthz") == (200, "all good\n")
        check.ok, check.detail = False, "projector: not running"
        assert get(server.port, "/healthz") == (503, "projector: not running\n")
        assert get(server.port, "/livez") == (200, "alive\n")  # unready, not dead: no restart
        check.ok = True
        assert get(server.port, "/healthz")[0] == 200


def test_a_failing_check_is_unhealthy(registry: CollectorRegistry) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("store gone")

    with serve_ops(HOST, 0, broken, registry) as server:
        assert get(server.port, "/healthz") == (503, "health check failed: RuntimeError: store gone\n")


@pytest.mark.parametrize("path", ["/", "/metrics/", "/healthz/x", "/favicon.ico", "/other"])
def test_other_paths_are_not_found(registry: CollectorRegistry, path: str) -> None:
    with serve_ops(HOST, 0, Switch(), registry) as server:
        status, body = get(server.port, path)
    assert status == 404
    assert "ops_test_requests" not in body


def test_a_port_in_use_is_a_pipeline_error(registry: CollectorRegistry) -> None:
    with serve_ops(HOST, 0, Switch(), registry) as first:
        with pytest.raises(PipelineError) as raised:
            serve_ops(HOST, first.port, Switch(), registry)
        assert raised.value.message == (f"the operations port (/metrics, /healthz) cannot listen on "
                                        f"{HOST}:{first.port}: Address already in use")
        assert get(first.port, "/healthz")[0] == 200  # the first one is untouched


def test_a_host_not_on_this_machine_is_a_pipeline_error(registry: CollectorRegistry) -> None:
    with pytest.raises(PipelineError) as raised:  # 192.0.2.0/24 is reserved for documentation
        serve_ops("192.0.2.1", 9100, Switch(), registry)
    assert raised.value.message == ("the operations port (/metrics, /healthz) cannot listen on 192.0.2.1:9100: "
                                    "Cannot assign requested address")


def test_close_releases_the_port(registry: CollectorRegistry) -> None:
    server = serve_ops(HOST, 0, Switch(), registry)
    port = server.port
    server.close()
    server.close()  # idempotent
    with pytest.raises(urllib.error.URLError):
        get(port, "/healthz")
    with serve_ops(HOST, port, Switch(), registry) as again:  # the same port binds again
        assert get(again.port, "/healthz")[0] == 200


@pytest.mark.parametrize("command", [["ship", "--root", "."], ["project", "--store", "views.sqlite"]])
def test_the_cli_names_a_port_in_use_in_one_line(tmp_path: Path, command: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        # --bootstrap is taken as given: the port is bound before any broker is contacted
        result = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", *command, "--bootstrap", "127.0.0.1:1",
                                 "--metrics-host", HOST, "--metrics-port", str(port)],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr == (f"dsh-pipeline {command[0]}: PipelineError: the operations port (/metrics, /healthz) "
                             f"cannot listen on {HOST}:{port}: Address already in use\n")


class TestConsumersHealth:
    def service(self, state: ServiceState = ServiceState.RUNNING, last_poll: float = 100.0,
                silences: dict[str, float] | None = None, assigning: float | None = None) -> SimpleNamespace:
        return SimpleNamespace(state=state, last_poll=last_poll, silences=lambda: dict(silences or {}),
                               assigning_for=lambda: assigning)

    def test_healthy_when_every_service_polls(self) -> None:
        check = consumers_health({"projector": self.service(), "auditor": self.service(last_poll=95.0)},
                                 stale_after=10, clock=lambda: 104.0)
        assert check() == (True, "ok")

    @pytest.mark.parametrize("state", [s for s in ServiceState if s is not ServiceState.RUNNING])
    def test_a_service_not_running_is_unhealthy_and_says_its_state(self, state: ServiceState) -> None:
        check = consumers_health({"projector": self.service(), "auditor": self.service(state=state)},
                                 stale_after=10, clock=lambda: 100.0)
        assert check() == (False, f"auditor: {state.value}, not running")

    def test_a_stale_poll_is_unhealthy(self) -> None:
        now = [105.0]
        service = self.service(last_poll=100.0)
        check = consumers_health({"archiver": service}, stale_after=10, clock=lambda: now[0])
        assert check()[0]
        now[0] = 110.0
        assert check() == (False, "archiver: last poll 10.0 s ago (stale after 10 s)")
        service.last_poll = 109.5  # it polled again
        assert check() == (True, "ok")

    def test_one_silent_partition_makes_a_service_unhealthy_and_is_named(self) -> None:
        silences = {"dsh.session-events[0]": 0.2, "dsh.session-events[1]": 12.5, "dsh.session-events[2]": 10.0}
        check = consumers_health({"projector": self.service(silences=silences), "auditor": self.service()},
                                 stale_after=10, clock=lambda: 101.0)
        assert check() == (False, "projector: no answer from the cluster for dsh.session-events[1] for 12.5 s, "
                                  "dsh.session-events[2] for 10.0 s (stale after 10 s)")

    def test_an_assignment_step_past_the_window_is_unhealthy_and_says_so(self) -> None:
        check = consumers_health({"auditor": self.service(assigning=61.0), "archiver": self.service(assigning=2.0)},
                                 stale_after=60, clock=lambda: 100.0)
        assert check() == (False, "auditor: taking partitions for 61.0 s (rebuilding their state or waiting for the "
                                  "cluster's offsets; stale after 60 s)")

    def test_no_service_is_unhealthy(self) -> None:
        assert consumers_health({})() == (False, "no service running")

    def test_reads_the_services_as_they_change(self) -> None:
        services: dict = {}
        check = consumers_health(services, clock=lambda: 0.0)
        services["projector"] = self.service(last_poll=0.0)
        assert check() == (True, "ok")
