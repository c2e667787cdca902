"""The auditor's record-level lossless rule (its pre-filters must never hide a defect)."""

import pytest

from consumers.auditor import lossless_problem


@pytest.mark.parametrize("value, problem", [
    (b'{"a":-0}', "negative zero -0"),
    (b'{"a":[1,-0.0]}', "negative zero -0.0"),
    (b'{"a": -0e3}', "negative zero -0e3"),
    (b'-0', "negative zero -0"),
    (b'{"n":9007199254740992}', "integer 9007199254740992 is outside ±(2^53-1)"),
    (b'{"n":[-123456789012345678901]}', "integer -123456789012345678901 is outside ±(2^53-1)"),
    (b'{"a":-0,"n":9007199254740993}', "negative zero -0; integer 9007199254740993 is outside ±(2^53-1)"),
])
def test_defects_are_named(value: bytes, problem: str) -> None:
    assert lossless_problem(value) == problem


@pytest.mark.parametrize("value", [
    b'{"n":9007199254740991,"m":-9007199254740991}',  # the safe extremes
    b'{"x":-0.5,"y":-0.001,"z":0.0}',
    b'{"when":"2026-01-02","id":"1234567890123456789012"}',  # digits and "-0" inside strings
    b'{"t":"a -0 b","u":"-0"}',
    b'not json -0',  # the fold refuses it with a better reason
])
def test_clean_values_pass(value: bytes) -> None:
    assert lossless_problem(value) is None
