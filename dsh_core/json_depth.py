"""The nesting limit of JSON texts: a text nested deeper than
:data:`MAX_DEPTH` is refused (:class:`~dsh_core.errors.DecodeError`) before
any decoder recurses into it (:func:`check_depth`, or a decoder wrapped in
:func:`bounded`), so nothing that walks a decoded value recursively can reach
Python's recursion limit. The pipeline's own stores may nest a few levels
more (:data:`STORED_DEPTH`)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import msgspec

from .errors import DecodeError

__all__ = ["MAX_DEPTH", "STORED_DEPTH", "bounded", "check_depth"]

#: The deepest nesting of arrays and objects a JSON text may have (serde_json's
#: default). dsh's logs nest 13 deep at most; every decoder, and everything that
#: walks a decoded value recursively, stays far below Python's recursion limit.
MAX_DEPTH = 128
#: What the pipeline's own stores (fold snapshots, views, state) may nest: a
#: value of a log, inside the few levels a snapshot or view wraps it in.
STORED_DEPTH = MAX_DEPTH + 16

# Outside strings, only these bytes matter to the nesting: `{` and `[` open, `}` and `]` close.
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
T = TypeVar("T")


def _nesting(data: bytes, limit: int) -> int:
    """An upper bound of the nesting depth of ``data`` (exact for valid JSON).

    String contents are cut out (escaped backslashes and quotes first), the
    brackets left are paired innermost first, one level per pass; an open
    bracket left unpaired counts as one more level. C-speed scans only."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(data.split(b'"')[0::2]).translate(_BRACKETS, _NOT_BRACKETS)
    depth = 0
    while b"[]" in brackets and depth <= limit:
        brackets = brackets.replace(b"[]", b"")
        depth += 1
    return depth + brackets.count(b"[")


def check_depth(data: bytes | str | msgspec.Raw, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`DecodeError` if the JSON text ``data`` nests arrays and
    objects deeper than ``limit``; checked before any decoder recurses."""
    if isinstance(data, str):
        raw = data.encode("utf-8", "surrogatepass")
    elif isinstance(data, (bytes, bytearray, memoryview, msgspec.Raw)):
        raw = data if isinstance(data, bytes) else bytes(data)
    else:
        return  # no JSON text at all: the decoder says so (bytes(n) would be n zero bytes)
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # the common case: too few brackets to nest that deep
    if _nesting(raw, limit) > limit:
        raise DecodeError(f"not a JSON value this reader takes: arrays and objects nested more than {limit} deep")


def bounded(decode: Callable[[Any], T]) -> Callable[[Any], T]:
    """``decode`` (a msgspec decoder's, or ``json.loads``) behind :func:`check_depth`."""
    def decode_bounded(data: Any) -> T:
        check_depth(data)
        return decode(data)
    return decode_bounded
