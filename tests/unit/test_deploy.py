"""The compose deployment stays in step with the code: the image gets every
package, every service command is one the CLI takes, and nothing it runs
without credentials is reachable beyond this host's loopback."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from dsh_pipeline.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_the_image_is_built_from_every_package():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in patterns}
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert packages <= allowed, f"the image would miss {sorted(packages - allowed)}"
    assert all((ROOT / package).is_dir() for package in packages)


def test_every_service_command_parses():
    commands = re.findall(r"^\s+command: (\[.*\])$", (ROOT / "docker-compose.yml").read_text(), re.MULTILINE)
    dsh_commands = [json.loads(command) for command in commands if not command.startswith('["--')]
    assert {command[0] for command in dsh_commands} == {"ship", "project", "serve", "audit", "archive"}
    for command in dsh_commands:
        build_parser().parse_args(command)


def test_compose_is_a_single_tenant_deployment_reachable_on_loopback_only():
    compose = (ROOT / "docker-compose.yml").read_text()
    published = re.findall(r"^\s+ports: \[(.*)\]$", compose, re.MULTILINE)
    assert published and all(port.strip().startswith('"127.0.0.1:') for line in published for port in line.split(","))
    assert "ports:" not in re.sub(r"^\s+ports: \[.*\]$", "", compose, flags=re.MULTILINE)  # no other spelling
    listeners = re.search(r"^\s+KAFKA_LISTENERS: (.*)$", compose, re.MULTILINE)[1].split(",")
    assert "CONTROLLER://localhost:9093" in listeners  # not on the compose network
    assert "# A single-tenant development deployment: Kafka takes clients without\n# credentials" in compose
