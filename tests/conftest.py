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
