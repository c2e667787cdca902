"""Shared fixtures: where the conformance corpus and the reference live."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _default_corpus() -> Path:
    """``../shared/corpus`` beside this checkout, or beside the repository a
    clone was made from (a fresh clone elsewhere, as CI makes)."""
    beside = ROOT.parent / "shared" / "corpus"
    if beside.is_dir():
        return beside
    origin = subprocess.run(["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
                            capture_output=True, text=True, check=False).stdout.strip()
    if origin and Path(origin).is_dir():
        return Path(origin).resolve().parent / "shared" / "corpus"
    return beside


CORPUS = Path(os.environ["DSH_CORPUS"]) if "DSH_CORPUS" in os.environ else _default_corpus()


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
