"""The documentation agrees with the code: every command shown parses with
the real parser, every ``DSH_*`` variable named exists, the generated pages
equal what the code draws now, and every Python example runs."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from dsh_pipeline.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
SOURCE_PACKAGES = ("dsh_core", "dsh_kafka", "producers", "consumers", "dsh_pipeline", "benchmarks", "tests")
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)


def _blocks(language: str) -> list[tuple[Path, int, str]]:
    found = []
    for page in PAGES:
        text = page.read_text("utf-8")
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start(2)) + 1
                found.append((page, line, match.group(2)))
    return found


def _commands() -> list[tuple[str, list[str]]]:
    commands = []
    for page, first, block in _blocks("sh"):
        for offset, line in enumerate(block.splitlines()):
            for part in re.split(r"&&|;|\|", line.split(" #", 1)[0]):
                if "dsh-pipeline" not in part:
                    continue
                words = shlex.split(part.strip().replace('"$', '"'), comments=True)
                if words and words[0].endswith("dsh-pipeline"):
                    commands.append((f"{page.relative_to(ROOT)}:{first + offset}", words[1:]))
    return commands


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_command_shown_parses(where, argv, capsys):
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code != 0:  # --help and --version exit 0
            pytest.fail(f"{where}: dsh-pipeline {shlex.join(argv)}: {capsys.readouterr().err.strip()}")


def test_every_variable_named_exists():
    source = "\n".join(path.read_text("utf-8") for package in SOURCE_PACKAGES
                       for path in (ROOT / package).rglob("*.py"))
    named = {name for page in PAGES for name in re.findall(r"\bDSH_[A-Z0-9_]*[A-Z0-9]\b", page.read_text("utf-8"))}
    missing = sorted(name for name in named if name not in source)
    assert not missing, f"variables the docs name but no code reads: {missing}"


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(_generator().PAGES))
def test_generated_pages_are_current(name):
    drawn = _generator().PAGES[name]()
    assert (DOCS / name).read_text("utf-8") == drawn, f"docs/{name} is stale: run python docs/generate.py"


PYTHON_BLOCKS = _blocks("python")


@pytest.mark.parametrize("page,line,code", PYTHON_BLOCKS,
                         ids=[f"{page.relative_to(ROOT)}:{line}" for page, line, _ in PYTHON_BLOCKS])
def test_python_examples_run(page, line, code, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"{page}:{line}", "exec"), {"__name__": "__docs__"})
