"""The compose deployment stays in step with the code: the image gets every
package, and every service command is one the CLI takes."""

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
