"""dsh 0.2.1's vocabulary of v0 payload checks: values, member sets, table steps.

The primitives of dsh's released-v0 payload validation (``releasedV0Record``,
``assertReleasedV0Keys``, ``stringValue``, ``countValue``, ``literalValue``,
``arrayValue``…), each raising dsh's text as the v0→v1 edge refuses it
(:func:`refusal`, ``unsupported-format``), and the steps the inventory table
(:mod:`.inventory`) is written in. A missing member is :data:`ABSENT`
(JavaScript's ``undefined``), so a check of it fails as dsh's does. JSON
``-0`` decodes to ``0`` here, so dsh's refusal of ``-0`` counts is not seen.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from ...errors import FormatUnsupportedError
from ...jsonvalue import encode_json, is_safe_int

__all__ = [
    "ABSENT", "COORDS", "EDGE", "Check", "Step", "array", "array_of", "before", "boolean", "count", "each",
    "earlier", "exact", "finite", "js", "js_keys", "keys", "lossless", "need", "nonempty", "nonnegative", "one_of",
    "opt", "positive", "record", "refusal", "safe_integer", "seq_array", "seqs", "string", "whole",
]

EDGE = "@deepseek-ai/dsh-session-format-v0-to-v1"

Check = Callable[[Any, str], Any]
Step = Callable[[dict[str, Any], str, int], None]


def refusal(message: str, edge: str = EDGE, version: int = 0) -> FormatUnsupportedError:
    """A refusal of an edge, worded as dsh wraps its format errors."""
    return FormatUnsupportedError(f"{edge} refuses this format v{version} Session: {message}")


def js(value: Any) -> str:
    return encode_json(value).decode()


def _js_string(value: Any) -> str:
    """ECMAScript ``String(value)`` for the literals dsh lists."""
    return ("true" if value else "false") if type(value) is bool else str(value)


_INDEX = re.compile(r"^(?:0|[1-9][0-9]*)$")


def js_keys(record: dict[str, Any]) -> list[str]:
    """``Object.keys`` order: array-index keys ascending, then insertion order."""
    indexes = sorted((key for key in record if _INDEX.match(key) and int(key) < 2**32 - 1), key=int)
    return indexes + [key for key in record if key not in set(indexes)]


# ------------------------------------------------------------------ primitives


def record(value: Any, label: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refusal(f"{label} must be a JSON object")
    return value


def keys(value: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...], label: str) -> None:
    """dsh's ``assertReleasedV0Keys``: the first unexpected member, then the first missing one."""
    unexpected = next((key for key in js_keys(value) if key not in required and key not in optional), None)
    if unexpected is not None:
        raise refusal(f"{label} has unexpected member {js(unexpected)}")
    missing = next((key for key in required if key not in value), None)
    if missing is not None:
        raise refusal(f"{label} lacks required member {js(missing)}")


def exact(value: Any, label: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    found = record(value, label)
    keys(found, required, optional, label)
    return found


def string(value: Any, label: str) -> str:
    if type(value) is not str:
        raise refusal(f"{label} must be a string")
    return value


def nonempty(value: Any, label: str) -> str:
    if type(value) is not str or not value:
        raise refusal(f"{label} must be a non-empty string")
    return value


def boolean(value: Any, label: str) -> bool:
    if type(value) is not bool:
        raise refusal(f"{label} must be a boolean")
    return value


def safe_integer(value: Any, label: str) -> int:
    if not is_safe_int(value):
        raise refusal(f"{label} must be a safe integer")
    return value


def count(value: Any, label: str) -> int:
    if not is_safe_int(value) or value < 0:
        raise refusal(f"{label} must be a non-negative safe integer")
    return value


def positive(value: Any, label: str) -> int:
    number = count(value, label)
    if number == 0:
        raise refusal(f"{label} must be positive")
    return number


def finite(value: Any, label: str) -> float:
    if type(value) is float and math.isfinite(value):
        return value
    if type(value) is int and math.isfinite(_as_float(value)):
        return value
    raise refusal(f"{label} must be a finite number")


def _as_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:  # beyond a double: JSON.parse makes it Infinity
        return math.inf


def one_of(*allowed: Any) -> Check:
    def check(value: Any, label: str) -> Any:
        if not any(type(value) is type(candidate) and value == candidate for candidate in allowed):
            raise refusal(f"{label} must be one of {', '.join(map(_js_string, allowed))}")
        return value
    return check


def array(value: Any, label: str, item: Check | None = None, item_label: str | None = None) -> list[Any]:
    """dsh's ``arrayValue``: each member checked under ``label[i]`` (or one fixed label)."""
    if not isinstance(value, list):
        raise refusal(f"{label} must be an array")
    for index, member in enumerate(value):
        if item is not None:
            item(member, item_label or f"{label}[{index}]")
    return value


def array_of(item: Check) -> Check:
    return lambda value, label: array(value, label, item)


def earlier(value: Any, seq: int, label: str) -> int:
    number = count(value, label)
    if number >= seq:
        raise refusal(f"{label} must identify an earlier event")
    return number


def seq_array(value: Any, seq: int, label: str, non_empty: bool) -> list[int]:
    seen: set[int] = set()

    def member(item: Any, item_label: str) -> None:
        found = earlier(item, seq, item_label)
        if found in seen:
            raise refusal(f"{label} repeats seq {found}")
        seen.add(found)
    values = array(value, label, member)
    if non_empty and not values:
        raise refusal(f"{label} must be non-empty")
    return values


def nonnegative(value: float, label: str) -> None:
    if value < 0:
        raise refusal(f"{label} must be non-negative")


def lossless(value: Any) -> bool:
    """Whether a member survives a JSON round trip (dsh's ``isJsonValue``: no infinities)."""
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is int:
        return math.isfinite(_as_float(value))
    if isinstance(value, dict):
        return all(lossless(member) for member in value.values())
    if isinstance(value, list):
        return all(lossless(member) for member in value)
    return True


# ---------------------------------------------------------------- table steps


def need(key: str, check: Check, suffix: str | None = None) -> Step:
    """Check member ``key`` (present or not) under ``label suffix``."""
    return lambda data, label, seq: check(data.get(key, ABSENT), f"{label} {suffix or key}")


def opt(key: str, check: Check, suffix: str | None = None) -> Step:
    """Check member ``key`` when it is present."""
    def step(data: dict[str, Any], label: str, seq: int) -> None:
        if key in data:
            check(data[key], f"{label} {suffix or key}")
    return step


def each(key: str, check: Check, item: str) -> Step:
    """An array member whose items are all checked under one label, ``label item``."""
    def step(data: dict[str, Any], label: str, seq: int) -> None:
        array(data.get(key, ABSENT), f"{label} {key}", check, f"{label} {item}")
    return step


def whole(check: Check) -> Step:
    """A check of the payload itself, under the event's label."""
    def step(data: dict[str, Any], label: str, seq: int) -> None:
        check(data, label)
    return step


def before(key: str, optional: bool = False) -> Step:
    """Member ``key`` names an earlier seq (when present, if ``optional``)."""
    def step(data: dict[str, Any], label: str, seq: int) -> None:
        if not optional or key in data:
            earlier(data.get(key, ABSENT), seq, f"{label} {key}")
    return step


def seqs(key: str, non_empty: bool) -> Step:
    """Member ``key`` is an array of distinct earlier seqs."""
    def step(data: dict[str, Any], label: str, seq: int) -> None:
        seq_array(data.get(key, ABSENT), seq, f"{label} {key}", non_empty)
    return step


class _Absent:
    """A member that is not there (JavaScript's ``undefined``)."""

    def __repr__(self) -> str:
        return "undefined"


ABSENT: Any = _Absent()

COORDS = (need("turn", count), need("step", count))
