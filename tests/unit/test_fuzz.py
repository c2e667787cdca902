"""The fuzzer of :mod:`tests.fuzzing` over the readers and the three
services' record paths, with a projector on each view-store backend that
needs no server, and the inputs it found, kept as regression cases.

The unit tier runs a few thousand inputs of a fixed seed (``DSH_FUZZ_SEED``
changes it); tests/integration/test_fuzz.py runs inputs through PostgreSQL
too, and holds the ``slow`` tier's million inputs. A failure names the
seed and the input; ``python -m tests.fuzzing SEED INDEX FILE`` writes that
input, to keep under ``tests/fuzz_corpus``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.fuzzing import Fuzzer, check_log
from tests.store_locations import SERVERLESS

CORPUS = Path(__file__).resolve().parents[1] / "fuzz_corpus"
FOUND = sorted(CORPUS.glob("*.jsonl"))
BACKENDS = [backend.name for backend in SERVERLESS]


@pytest.fixture(autouse=True)
def _quiet_services():
    """The services log a line per refusal and batch: thousands here."""
    logger = logging.getLogger("dsh")
    level, logger.level = logger.level, logging.CRITICAL
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("found", FOUND, ids=[path.stem for path in FOUND])
def test_found_inputs_are_read_and_served_without_a_crash(found):
    check_log(found.read_bytes(), BACKENDS)


def test_an_input_nesting_one_deep_value_in_another_is_built():
    """Input 349,785 of seed 1207 nests a value past what Python's json
    writes: the fuzzer keeps the line as it was instead of stopping."""
    source, data = Fuzzer(1207).input(349_785)
    assert source and data.endswith(b"\n")


def test_fuzz_a_few_thousand_inputs():
    seed = int(os.environ.get("DSH_FUZZ_SEED", "20261207"))
    Fuzzer(seed, services_every=8, backends=BACKENDS).run(0, 3000)


def test_a_backend_the_registry_has_not_is_named():
    with pytest.raises(ValueError, match=r"no view-store backend \['mysql'\]: the registry has \['memory', "
                                         r"'postgresql', 'sqlite'\]"):
        Fuzzer(1, backends=("sqlite", "mysql"))
