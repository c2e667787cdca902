"""The fuzzer of :mod:`tests.fuzzing` over the readers and the three
services' record paths, with a projector on each view-store backend that
needs no server, and the inputs it found, kept as regression cases.

The unit tier runs a few thousand inputs of a fixed seed (``DSH_FUZZ_SEED``
changes it); tests/integration/test_fuzz.py runs inputs through PostgreSQL
too, and holds the ``slow`` tier's million inputs. A failure names the
seed and the input, which the fuzzer keeps under ``tests/fuzz_corpus``.
"""

from __future__ import annotations

import os

import pytest

from consumers.auditor import Audit
from tests.fuzzing import Crash, Fuzzer, check_log, found_inputs
from tests.store_locations import SERVERLESS

FOUND = found_inputs()
BACKENDS = [backend.name for backend in SERVERLESS]


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


def test_an_internal_dead_letter_in_a_batch_names_its_input_and_keeps_it(monkeypatch, tmp_path):
    """Input 13's records reach a bug (an ``internal`` dead letter) in a
    batch of ten inputs: the batch is fed again one input at a time, and
    the crash names input 13, whose log is kept in the found inputs."""
    handle = Audit.handle

    def buggy(self, record, decoded):
        if decoded.session_id.endswith("~13"):
            raise TypeError("a bug input 13 reaches")
        handle(self, record, decoded)

    monkeypatch.setattr(Audit, "handle", buggy)
    fuzzer = Fuzzer(5, batch=10, backends=["memory"], found=tmp_path)
    with pytest.raises(Crash, match=r"^fuzz seed 5 input 13 \(.+\): auditor: internal dead letter: .*TypeError: a "
                                    r"bug input 13 reaches; kept as .*seed-5-input-13\.jsonl"):
        fuzzer.run(0, 30)
    assert [path.name for path in tmp_path.iterdir()] == ["seed-5-input-13.jsonl"]
    assert (tmp_path / "seed-5-input-13.jsonl").read_bytes() == fuzzer.input(13)[1]


def test_a_batch_that_crashes_only_as_a_batch_names_its_inputs(monkeypatch, tmp_path):
    def refuse_many(self, session_ids):
        if len(session_ids) > 1:
            raise RuntimeError("a batch of several sessions")

    monkeypatch.setattr(Audit, "prepare", refuse_many)
    with pytest.raises(Crash, match=r"^fuzz seed 5 inputs 0\.\.9 crash as one batch but none alone: auditor stops: "
                                    r"RuntimeError: a batch of several sessions$"):
        Fuzzer(5, batch=10, backends=["memory"], found=tmp_path).run(0, 30)
    assert not list(tmp_path.iterdir())
