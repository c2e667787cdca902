"""Request headers (docs/formats/v0.md §6.1): canonical form, equality and the header fold."""

from __future__ import annotations

from typing import Any, Iterable

from .jsonvalue import FrozenDict, encode_json, json_equal

__all__ = ["canonical_header", "header_equals", "fold_request_header"]

_CONFIG_SCALARS = ("provider", "model", "reasoningEffort", "temperature", "maxTokens")


def canonical_header(header: Any) -> FrozenDict:
    """``config`` as is; ``adapterDefaults`` only if a flag is ``true``;
    ``system`` and ``tools`` only if non-empty; every other key dropped."""
    out: dict[str, Any] = {"config": header.get("config")}
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, dict) and (defaults.get("reasoningEffort") is True or defaults.get("maxTokens") is True):
        out["adapterDefaults"] = defaults
    system = header.get("system")
    if _non_empty(system):
        out["system"] = system
    tools = header.get("tools")
    if _non_empty(tools):
        out["tools"] = tools
    return FrozenDict(out)


def _non_empty(value: Any) -> bool:
    """``value.length > 0`` as the reference evaluates it: a string's or an
    array's length, an object's own numeric ``length``; anything else has
    none (``undefined > 0`` is false)."""
    if isinstance(value, (str, list, tuple)):
        return len(value) > 0
    if isinstance(value, dict):
        length = value.get("length")
        return (type(length) is int or type(length) is float) and length > 0
    return False


_MISSING: Any = object()


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    return json_equal(a, b)


def header_equals(a: Any, b: Any) -> bool:
    """The writer's "is a ``change`` owed?" test over canonical headers:
    config fields by value, ``stop`` element-wise (absent ≠ ``[]``), adapter
    flags and ``system`` by value, tools pairwise by their serialized JSON
    text (key order matters)."""
    ca, cb = a.get("config") or {}, b.get("config") or {}
    for key in _CONFIG_SCALARS:
        if not _same(ca.get(key, _MISSING), cb.get(key, _MISSING)):
            return False
    if not _same(ca.get("stop", _MISSING), cb.get("stop", _MISSING)):
        return False
    da, db = a.get("adapterDefaults") or {}, b.get("adapterDefaults") or {}
    for flag in ("reasoningEffort", "maxTokens"):
        if da.get(flag) is not db.get(flag) and da.get(flag) != db.get(flag):
            return False
    if a.get("system") != b.get("system"):
        return False
    ta, tb = a.get("tools") or (), b.get("tools") or ()
    return len(ta) == len(tb) and all(encode_json(x) == encode_json(y) for x, y in zip(ta, tb))


def fold_request_header(events: Iterable[Any], start: Any = None) -> Any:
    """Canonical form of the last ``request/header`` event, else ``start``."""
    state = start
    for event in events:
        if event.type == "request/header":
            state = canonical_header(event.data["header"])
    return state
