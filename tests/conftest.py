"""Shared fixtures: where the conformance corpus and the reference live."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


#: The conformance corpus: real dsh logs with the reference's expected outputs
#: (``tests/corpus``; its README says what each file holds). ``DSH_CORPUS``
#: points the tests at another copy of the same layout.
CORPUS = Path(os.environ.get("DSH_CORPUS", ROOT / "tests" / "corpus"))


def canonical(value: object) -> str:
    """The corpus README's comparison form: sorted keys, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def corpus_logs(*folders: str) -> list[Path]:
    logs = [log for folder in folders for log in sorted((CORPUS / folder).glob("*.jsonl"))]
    if not logs:
        raise RuntimeError(f"no conformance corpus under {CORPUS} (set DSH_CORPUS)")
    return logs


def expected_of(log: Path) -> dict:
    return json.loads(log.with_name(log.stem + ".expected.json").read_text("utf-8"))


@pytest.fixture
def corpus_dir() -> Path:
    return CORPUS


def _escaped(value: object) -> object:
    """``value`` with each string's lone surrogates written as ``\\udXXX``."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {key: _escaped(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_escaped(item) for item in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    """A report as pytest-xdist's workers send it, lone surrogates escaped:
    the fuzzers feed the services lone surrogates on purpose, the services'
    warnings quote them, and a report whose captured log holds one cannot be
    sent as UTF-8 (pytest-xdist#843: the worker would crash)."""
    return _escaped((yield))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need Jaeger run last, its first build beside the others
    (:func:`tests.jaeger.build_in_background`)."""
    if not hasattr(config, "workerinput"):  # pytest-xdist's controller schedules; its workers only run
        from tests.jaeger import build_in_background
        build_in_background(items)
