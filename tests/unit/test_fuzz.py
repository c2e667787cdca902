"""The fuzzer of :mod:`tests.fuzzing` over the readers and the three
services' record paths, and the inputs it found, kept as regression cases.

The unit tier runs a few thousand inputs of a fixed seed (``DSH_FUZZ_SEED``
changes it); the ``slow`` tier runs ``DSH_FUZZ_INPUTS`` (default 1,000,000)
of a random seed, every input through the services too, on
``DSH_FUZZ_WORKERS`` processes (default: one per core)::

    DSH_FUZZ_INPUTS=20000 .venv/bin/python -m pytest -m slow -s tests/unit/test_fuzz.py

A failure names the seed and the input; ``python -m tests.fuzzing SEED
INDEX FILE`` writes that input, to keep under ``tests/fuzz_corpus``.
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path

import pytest

from tests.fuzzing import Fuzzer, check_log

CORPUS = Path(__file__).resolve().parents[1] / "fuzz_corpus"
FOUND = sorted(CORPUS.glob("*.jsonl"))


@pytest.fixture(autouse=True)
def _quiet_services():
    """The services log a line per refusal and batch: thousands here."""
    logger = logging.getLogger("dsh")
    level, logger.level = logger.level, logging.CRITICAL
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("found", FOUND, ids=[path.stem for path in FOUND])
def test_found_inputs_are_read_and_served_without_a_crash(found):
    check_log(found.read_bytes())


def test_an_input_nesting_one_deep_value_in_another_is_built():
    """Input 349,785 of seed 1207 nests a value past what Python's json
    writes: the fuzzer keeps the line as it was instead of stopping."""
    source, data = Fuzzer(1207).input(349_785)
    assert source and data.endswith(b"\n")


def test_fuzz_a_few_thousand_inputs():
    seed = int(os.environ.get("DSH_FUZZ_SEED", "20261207"))
    Fuzzer(seed, services_every=8).run(0, 3000)


@pytest.mark.slow
def test_fuzz_a_million_inputs():
    seed = int(os.environ.get("DSH_FUZZ_SEED", random.randrange(2**32)))
    inputs = int(os.environ.get("DSH_FUZZ_INPUTS", "1000000"))
    workers = int(os.environ.get("DSH_FUZZ_WORKERS", os.cpu_count() or 1))
    started = time.perf_counter()

    def progress(done: int) -> None:
        elapsed = time.perf_counter() - started
        print(f"fuzz seed {seed}: {done} of {inputs} inputs checked in {elapsed:.0f} s ({done / elapsed:.1f}/s)",
              flush=True)

    Fuzzer(seed).run(0, inputs, workers, progress)
    elapsed = time.perf_counter() - started
    print(f"fuzz seed {seed}: {inputs} inputs in {elapsed:.0f} s ({inputs / elapsed:.1f}/s), no crash")
