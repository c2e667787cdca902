"""The fuzzer of :mod:`tests.fuzzing` with a projector on every backend
deployments run on (the registry's shared ones: a SQLite file and a
PostgreSQL database), each input through both.

The integration tier runs a thousand inputs and the found inputs; the
``slow`` tier runs ``DSH_FUZZ_INPUTS`` (default 1,000,000) of a random seed
(``DSH_FUZZ_SEED``) from input ``DSH_FUZZ_FIRST`` (default 0: a run cut
short continues where its last progress line ends), every input through
the services, on
``DSH_FUZZ_WORKERS`` processes (default: one per core), with projectors on
``DSH_FUZZ_BACKENDS`` (comma-separated names; default ``sqlite,postgresql``)::

    DSH_FUZZ_INPUTS=20000 .venv/bin/python -m pytest -m slow -s tests/integration/test_fuzz.py
"""

from __future__ import annotations

import os
import random
import time

import pytest

from consumers.runtime.store_backends import BACKENDS as REGISTRY
from tests import postgres_fixture
from tests.fuzzing import Fuzzer, check_log, found_inputs

postgres_dsn = postgres_fixture.postgres_dsn
DEPLOYED = [backend.name for backend in REGISTRY if backend.shared]


def test_found_inputs_are_served_on_every_backend_without_a_crash(postgres_dsn):
    for found in found_inputs():
        check_log(found.read_bytes(), DEPLOYED, postgres_dsn)


def test_fuzz_a_thousand_inputs_on_every_backend(postgres_dsn):
    seed = int(os.environ.get("DSH_FUZZ_SEED", "20261207"))
    Fuzzer(seed, services_every=3, backends=DEPLOYED, postgres_dsn=postgres_dsn).run(0, 1000)


@pytest.mark.slow
def test_fuzz_a_million_inputs(postgres_dsn):
    seed = int(os.environ.get("DSH_FUZZ_SEED", random.randrange(2**32)))
    inputs = int(os.environ.get("DSH_FUZZ_INPUTS", "1000000"))
    first = int(os.environ.get("DSH_FUZZ_FIRST", "0"))
    workers = int(os.environ.get("DSH_FUZZ_WORKERS", os.cpu_count() or 1))
    backends = os.environ.get("DSH_FUZZ_BACKENDS", ",".join(DEPLOYED)).split(",")
    started = time.perf_counter()

    def progress(done: int) -> None:
        elapsed = time.perf_counter() - started
        print(f"fuzz seed {seed}: {done} of {inputs} inputs from {first} checked in {elapsed:.0f} s "
              f"({done / elapsed:.1f}/s)", flush=True)

    Fuzzer(seed, backends=backends, postgres_dsn=postgres_dsn).run(first, first + inputs, workers, progress)
    elapsed = time.perf_counter() - started
    print(f"fuzz seed {seed}: {inputs} inputs in {elapsed:.0f} s ({inputs / elapsed:.1f}/s) through projectors on "
          f"{', '.join(backends)}, no crash")
