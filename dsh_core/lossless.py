"""Lossless JSON validation (docs/formats/v0.md §3): whether a value survives
a JSON round trip unchanged (:func:`check_lossless`: finite numbers, no
negative zero, integers within ±(2^53−1), string keys, no cycles), and the
detached, frozen copy a log keeps of it (:func:`snapshot`). Refusals are
:class:`~dsh_core.errors.LosslessJsonError` naming where and the JSON path."""

from __future__ import annotations

import math
from typing import Any

from .errors import LosslessJsonError
from .jsonvalue import MAX_SAFE_INTEGER, FrozenDict

__all__ = ["check_lossless", "snapshot"]

def _path(parts: list[str | int]) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _copy_lossless(value: Any, where: str, frozen: bool) -> Any:
    """Validate ``value`` as lossless JSON and return a detached copy.

    Recursive, a frame per level: a decoded value nests at most
    :data:`~dsh_core.json_depth.MAX_DEPTH` deep. Aliased sub-objects are accepted (copied twice); a cycle is rejected.
    """
    ancestors: set[int] = set()
    path: list[str | int] = []

    def fail(reason: str) -> LosslessJsonError:
        prefix = f"{where}: " if where else ""
        return LosslessJsonError(f"{prefix}{reason} at {_path(path)}")

    def visit(current: Any, in_frozen: bool) -> Any:
        kind = type(current)
        if current is None or kind is str or kind is bool:
            return current
        if kind is int:
            if -MAX_SAFE_INTEGER <= current <= MAX_SAFE_INTEGER:
                return current
            raise fail(f"integer {current} is outside ±(2^53-1)")
        if kind is float:
            if math.isnan(current) or math.isinf(current):
                raise fail(f"non-finite number {current!r}")
            if current == 0 and math.copysign(1.0, current) < 0:
                raise fail("negative zero")
            return int(current) if current.is_integer() and abs(current) <= MAX_SAFE_INTEGER else current
        # A tuple is only an array inside a value this module froze (v0 §3.2
        # rejects caller-built tuples).
        if kind is list or kind is dict or kind is FrozenDict or (kind is tuple and in_frozen):
            marker = id(current)
            if marker in ancestors:
                raise fail("cycle")
            ancestors.add(marker)
            try:
                if kind is dict or kind is FrozenDict:
                    out: dict[str, Any] = {}
                    for key, item in current.items():
                        if type(key) is not str:
                            raise fail(f"non-string key {key!r}")
                        path.append(key)
                        out[key] = visit(item, kind is FrozenDict)
                        path.pop()
                    return FrozenDict(out) if frozen else out
                items = []
                for index, item in enumerate(current):
                    path.append(index)
                    items.append(visit(item, kind is tuple))
                    path.pop()
                return tuple(items) if frozen else items
            finally:
                ancestors.discard(marker)
        raise fail(f"{kind.__name__} is not a JSON value")

    return visit(value, type(value) is FrozenDict)


def check_lossless(value: Any, where: str = "") -> None:
    """Raise :class:`LosslessJsonError` (naming ``where`` and the JSON path)
    unless ``value`` survives a JSON round trip unchanged."""
    _copy_lossless(value, where, frozen=False)


def snapshot(value: Any, where: str = "") -> Any:
    """Validate ``value`` as lossless JSON and return a detached, frozen copy."""
    return _copy_lossless(value, where, frozen=True)
