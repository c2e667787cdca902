"""Lossless JSON (docs/formats/v0.md §3): immutable values, dsh-compatible
serialization, canonical JSON (RFC 8785 / JCS) and digests. Validation and
frozen snapshots of caller-built values: :mod:`dsh_core.lossless`.

Values are the plain Python JSON model: ``None``, ``bool``, ``int``, ``float``,
``str``, ``list``/``tuple`` and ``dict`` with ``str`` keys. Stored values are
frozen (:class:`FrozenDict`, ``tuple``) so nothing handed out can rewrite the log.

Decoding follows ECMAScript's ``JSON.parse`` as dsh does: an integral float
(``1.0``, ``-0.0``) is the same number as the integer, so it decodes to ``int``;
other floats stay ``float``. Encoding follows ``JSON.stringify`` byte for byte
(ECMAScript number form, integer-like keys first, lone surrogates escaped).
A text nested deeper than :data:`~dsh_core.json_depth.MAX_DEPTH` is refused
before any decoder recurses into it (:mod:`dsh_core.json_depth`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, TypeGuard

import msgspec

from .errors import DecodeError, LosslessJsonError
from .json_depth import MAX_DEPTH, check_depth

__all__ = [
    "MAX_SAFE_INTEGER",
    "FrozenDict",
    "is_safe_int",
    "freeze",
    "thaw",
    "decode_json",
    "encode_json",
    "dump_json",
    "canonical_json",
    "sha256_jcs",
    "json_equal",
    "es_number",
]

MAX_SAFE_INTEGER = 2**53 - 1


class FrozenDict(dict[Any, Any]):
    """A ``dict`` that refuses mutation; what the log hands out for objects."""

    __slots__ = ()

    def _immutable(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("session log values are immutable")

    __setitem__ = __delitem__ = __ior__ = _immutable
    clear = pop = popitem = setdefault = update = _immutable

    def __copy__(self) -> "FrozenDict":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "FrozenDict":
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as a plain dict would be, then frozen
        return FrozenDict, (dict(self),)

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(canonical_json(self))


def is_safe_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` (never ``bool``) within ±(2^53−1)."""
    return type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def freeze(value: Any) -> Any:
    """Return an immutable deep copy of a decoded JSON value (no validation)."""
    kind = type(value)
    if kind is dict:
        out = FrozenDict(value)
        for key, item in value.items():
            kind = type(item)
            if kind is dict or kind is list:
                _dict_set(out, key, freeze(item))
        return out
    if kind is list:
        return tuple([freeze(v) if type(v) is dict or type(v) is list else v for v in value])
    return value


_dict_set = dict.__setitem__


def thaw(value: Any) -> Any:
    """Return a mutable deep copy (``dict``/``list``) of a JSON value."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


# --------------------------------------------------------------------- decoding


def float_hook(text: str) -> float | int:
    """msgspec's float hook for ``JSON.parse`` semantics (integral → int)."""
    value = float(text)
    if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)  # JSON.parse: 1.0 and -0.0 are the integers 1 and 0
    return value


_decoder = msgspec.json.Decoder(float_hook=float_hook)


def _json_fallback_float(text: str) -> float | int:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} overflows a double")
    return float_hook(text)


def decode_json(data: bytes | str | msgspec.Raw, max_depth: int = MAX_DEPTH) -> Any:
    """Decode one JSON text the way ``JSON.parse`` does, nested at most
    ``max_depth`` deep (:class:`DecodeError` otherwise).

    The fast path is msgspec; texts it refuses but ECMAScript accepts (lone
    surrogate escapes, integers beyond 64 bits) go through the stdlib parser.
    """
    check_depth(data, max_depth)
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        try:
            text = data if isinstance(data, str) else bytes(data).decode("utf-8")
            return json.loads(text, parse_float=_json_fallback_float,
                              parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError):
            raise DecodeError(f"not a JSON value: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# --------------------------------------------------------------------- encoding


def es_number(value: float) -> str:
    """Format a finite float exactly as ECMAScript ``Number::toString`` does."""
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return str(int(value))
    sign = "-" if value < 0 else ""
    digits, _, exponent = repr(abs(value)).partition("e")
    mantissa = digits.replace(".", "")
    point = digits.index(".") if "." in digits else len(digits)
    n = point + (int(exponent) if exponent else 0)
    stripped = mantissa.lstrip("0")
    n -= len(mantissa) - len(stripped)
    mantissa = stripped.rstrip("0") or "0"
    k = len(mantissa)
    if k <= n <= 21:
        return sign + mantissa + "0" * (n - k)
    if 0 < n <= 21:
        return sign + mantissa[:n] + "." + mantissa[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + mantissa
    exp = n - 1
    exp_text = f"e+{exp}" if exp >= 0 else f"e-{-exp}"
    if k == 1:
        return sign + mantissa + exp_text
    return sign + mantissa[0] + "." + mantissa[1:] + exp_text


_ARRAY_INDEX = re.compile(r"^(?:0|[1-9][0-9]*)$")
# Where msgspec's bytes may differ from JSON.stringify's: a number token with
# an exponent, an integral float ("1.0"), a long digit run (an integer beyond
# 2^53), or an integer-like key (JS sorts those first). Looked for with
# C-speed scans (a regex over every byte costs more than the encoding): digits
# are mapped to 0 and '-' dropped, so each number shape is a plain substring;
# string contents are cut out before those are searched.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else byte for byte in range(256))
_NUMBER_SHAPES = (b"0e", b"0.0,", b"0.0]", b"0.0}", b"0" * 17)
_INDEX_KEY = re.compile(rb',"(?:0|[1-9][0-9]*)":')


def _needs_exact_writer(fast: bytes) -> bool:
    """Whether msgspec's output may differ from ``JSON.stringify``'s."""
    if not fast.startswith((b"{", b"[", b'"')):
        return True  # a bare scalar: the exact writer is as cheap
    digits = fast.translate(_DIGITS_AS_ZERO, b"-")
    if any(shape in digits for shape in _NUMBER_SHAPES):
        unescaped = digits.replace(b"\\\\", b"").replace(b'\\"', b"")
        outside_strings = b"".join(unescaped.split(b'"')[0::2])
        if any(shape in outside_strings for shape in _NUMBER_SHAPES):
            return True
    # An integer-like key after the first (the first needs no moving) shows
    # as ,"0...":, which a regex confirms.
    return b',"0' in digits and b'0":' in digits and _INDEX_KEY.search(fast) is not None


_encoder = msgspec.json.Encoder()
#: The least integer magnitude a double cannot hold (rounds to Infinity).
_DOUBLE_OVERFLOW = 2**1024 - 2**970
_sorted_encoder = msgspec.json.Encoder(order="sorted")
_ASTRAL = re.compile(rb"[\xf0-\xf4]")  # the lead byte of a 4-byte UTF-8 character


def _is_array_index(key: str) -> bool:
    return bool(_ARRAY_INDEX.match(key)) and int(key) < 2**32 - 1


def _encode_string(text: str) -> str:
    try:
        return _encoder.encode(text).decode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates: JSON.stringify writes them as \udxxx escapes.
        parts = []
        for ch in text:
            code = ord(ch)
            if 0xD800 <= code <= 0xDFFF:
                parts.append(f"\\u{code:04x}")
            else:
                parts.append(_encoder.encode(ch).decode("utf-8")[1:-1])
        return '"' + "".join(parts) + '"'


def _write(value: Any, out: list[str], canonical: bool) -> None:
    kind = type(value)
    if value is None:
        out.append("null")
    elif kind is bool:
        out.append("true" if value else "false")
    elif kind is int:
        # Beyond 2^53 ECMAScript holds (and prints) the nearest double;
        # beyond the doubles, Infinity, which JSON.stringify writes as null.
        out.append(str(value) if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
                   else es_number(float(value)) if abs(value) < _DOUBLE_OVERFLOW else "null")
    elif kind is float:
        out.append(es_number(value))
    elif kind is str:
        out.append(_encode_string(value))
    elif isinstance(value, dict):
        keys = list(value.keys())
        if canonical:
            keys.sort(key=lambda k: k.encode("utf-16-be"))
        else:
            index_keys = sorted((k for k in keys if _is_array_index(k)), key=int)
            if index_keys:
                keys = index_keys + [k for k in keys if not _is_array_index(k)]
        out.append("{")
        for position, key in enumerate(keys):
            if position:
                out.append(",")
            out.append(_encode_string(key))
            out.append(":")
            _write(value[key], out, canonical)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for position, item in enumerate(value):
            if position:
                out.append(",")
            _write(item, out, canonical)
        out.append("]")
    elif isinstance(value, msgspec.Struct):
        _write(msgspec.to_builtins(value), out, canonical)
    else:
        raise LosslessJsonError(f"{kind.__name__} is not a JSON value")


def encode_json(value: Any) -> bytes:
    """Serialize like ECMAScript ``JSON.stringify`` (the bytes dsh writes)."""
    try:
        fast = _encoder.encode(value)
    except UnicodeEncodeError:
        fast = None
    if fast is not None and not _needs_exact_writer(fast):
        return fast
    out: list[str] = []
    _write(value, out, canonical=False)
    return "".join(out).encode("utf-8", "surrogatepass")


def dump_json(value: Any) -> bytes:
    """Lossless JSON for the pipeline's own stores (checkpoints, views):
    bytes :func:`decode_json` reads back as an equal value, frozen values
    included, but not necessarily ``JSON.stringify``'s — anything dsh or a
    digest sees goes through :func:`encode_json` or :func:`canonical_json`."""
    try:
        return _encoder.encode(value)
    except UnicodeEncodeError:  # a lone surrogate, which msgspec cannot write
        return encode_json(value)


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical form: keys sorted by UTF-16 code units, no
    whitespace, ECMAScript numbers, ``JSON.stringify`` string escapes.

    msgspec's sorted output is already that unless a number needs the
    ECMAScript form or a 4-byte character could sort differently in UTF-16
    than in code points; only then the exact writer runs."""
    try:
        fast = _sorted_encoder.encode(value)
    except UnicodeEncodeError:
        fast = None
    if fast is not None and not _needs_exact_writer(fast) and (fast.isascii() or not _ASTRAL.search(fast)):
        return fast
    out: list[str] = []
    _write(value, out, canonical=True)
    return "".join(out).encode("utf-8", "surrogatepass")


def sha256_jcs(value: Any) -> str:
    """Hex SHA-256 of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def json_equal(a: Any, b: Any) -> bool:
    """Structural, type-aware JSON equality: ``1 == 1.0``, ``True != 1``,
    key order irrelevant, arrays (``list`` or ``tuple``) element-wise."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        return all(k in b and json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        return all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)):
        return isinstance(b, (int, float)) and a == b
    return type(a) is type(b) and a == b
