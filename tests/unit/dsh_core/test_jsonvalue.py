"""Lossless JSON (docs/formats/v0.md §3) and dsh-compatible encoding."""

from __future__ import annotations

import json
from decimal import Decimal

import msgspec
import pytest

from dsh_core.errors import LosslessJsonError
from dsh_core.jsonvalue import (
    FrozenDict,
    canonical_json,
    decode_json,
    encode_json,
    es_number,
    json_equal,
    sha256_jcs,
)
from dsh_core.lossless import check_lossless, snapshot


@pytest.mark.parametrize("bad, path", [
    (float("nan"), "$"),
    ({"a": [1, {"b": float("inf")}]}, "$.a[1].b"),
    ({"x": -0.0}, "$.x"),
    ([float("-inf")], "$[0]"),
])
def test_non_finite_and_negative_zero_rejected_with_path(bad, path):
    with pytest.raises(LosslessJsonError) as info:
        check_lossless(bad, "user/message seq 3")
    assert str(info.value).startswith("user/message seq 3: ")
    assert str(info.value).endswith(f" at {path}")


def test_error_names_where_and_path():
    with pytest.raises(LosslessJsonError) as info:
        check_lossless({"a": {"b": float("nan")}}, 'session "s" seq 4 "turn/end"')
    assert str(info.value) == 'session "s" seq 4 "turn/end": non-finite number nan at $.a.b'


@pytest.mark.parametrize("bad", [(1, 2), {1, 2}, b"x", {1: "a"}, Decimal("1.5"), object(),
                                 msgspec.Struct, {"k": (1,)}])
def test_non_json_values_rejected(bad):
    with pytest.raises(LosslessJsonError):
        check_lossless(bad)


def test_aliasing_accepted_cycle_rejected():
    shared = {"x": 1}
    check_lossless({"a": shared, "b": shared, "c": [shared, shared]})
    cyclic: dict = {"a": []}
    cyclic["a"].append(cyclic)
    with pytest.raises(LosslessJsonError, match="cycle"):
        check_lossless(cyclic)


def test_integer_range():
    check_lossless(2**53 - 1)
    check_lossless(-(2**53 - 1))
    with pytest.raises(LosslessJsonError, match="outside"):
        check_lossless(2**53)


def test_accepted_values():
    for good in [None, True, "", "\ud800", 1.5, 1e300, {"": 1, "__proto__": 2}, [[[]]], {"a": None}]:
        check_lossless(good)


def test_snapshot_is_detached_and_frozen():
    data = {"a": [1, {"b": 2}]}
    copy = snapshot(data)
    data["a"][1]["b"] = 3
    assert copy["a"][1]["b"] == 2
    with pytest.raises(TypeError):
        copy["a"] = 1
    with pytest.raises(TypeError):
        copy["a"][1]["b"] = 5
    assert isinstance(copy, FrozenDict) and isinstance(copy["a"], tuple)
    # a frozen value may be appended again as it is
    assert snapshot({"again": copy}) == {"again": copy}


@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (1e16, "10000000000000000"), (1e21, "1e+21"), (1e-7, "1e-7"), (0.1, "0.1"),
    (123456789012345680000.0, "123456789012345680000"), (1.5e300, "1.5e+300"), (5e-324, "5e-324"),
    (1e-6, "0.000001"), (-2.5e-8, "-2.5e-8"), (123.456, "123.456"), (0.000123, "0.000123"),
    (2.0**60, "1152921504606847000"), (-0.0, "0"),
])
def test_ecmascript_number_form(value, text):
    assert es_number(value) == text


def test_encode_like_json_stringify():
    assert encode_json({"b": 1, "0": 2, "10": 3, "a": [1.5, 1e-6]}) == b'{"0":2,"10":3,"b":1,"a":[1.5,0.000001]}'
    assert encode_json("a\x00\x08\x1f\x7f\u2028\"\\") == b'"a\\u0000\\b\\u001f\x7f\xe2\x80\xa8\\"\\\\"'
    assert encode_json("\ud800") == b'"\\ud800"'
    assert encode_json([2**60]) == b"[1152921504606847000]"


def test_decode_like_json_parse():
    assert decode_json(b'{"a":1.0,"b":-0.0,"c":1.5}') == {"a": 1, "b": 0, "c": 1.5}
    assert type(decode_json(b"1.0")) is int
    assert decode_json(b'"\\ud800"') == "\ud800"


def test_canonical_json_is_jcs():
    # RFC 8785 §3.2.3: keys sorted by UTF-16 code units; numbers in ES form
    value = {"\u20ac": "Euro", "\r": "CR", "\ufb33": "Hebrew", "1": "One", "\U0001f600": "Emoji", "\u0080": "Ctl",
             "\u00f6": "Latin"}
    keys = [k for k in json.loads(canonical_json(value))]
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    assert canonical_json({"b": [1e21, 0.5], "a": None}) == b'{"a":null,"b":[1e+21,0.5]}'
    assert sha256_jcs({"a": 1}) == sha256_jcs({"a": 1.0})


def test_json_equal_is_type_aware():
    assert json_equal(1, 1.0)
    assert not json_equal(True, 1)
    assert json_equal({"a": [1, 2]}, FrozenDict(a=(1, 2)))
    assert not json_equal({"a": 1}, {"a": 1, "b": None})
    assert not json_equal([], {})


def test_an_integer_beyond_the_doubles_is_written_as_json_stringify_writes_infinity():
    """JSON.parse holds a 400-digit integer as Infinity; JSON.stringify writes null."""
    huge = decode_json(b"[-" + b"9" * 400 + b"]")
    assert encode_json(huge) == canonical_json(huge) == b"[null]"
    assert encode_json([2**1024 - 2**971, 2**1024 - 2**970]) == b"[1.7976931348623157e+308,null]"
