"""The public surface of dsh_core is pinned: changing it is a decision.

Each package's ``__all__`` must be exactly the public names it binds, and
the sorted list must match its pin file in ``tests/unit/dsh_core/api/``;
every dsh_core module another package imports from is pinned the same way,
and the names the other packages import are pinned in ``imported.txt``
(depending on one more is a decision too).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest

import dsh_core
import dsh_core.formats
import dsh_core.migration
import dsh_core.storage

PINS = Path(__file__).parent / "api"
IMPORTED_PIN = PINS / "imported.txt"
ROOT = Path(__file__).resolve().parents[3]
#: The packages built on dsh_core.
OTHERS = ("consumers", "producers", "dsh_pipeline", "dsh_kafka")


@functools.cache
def _imported_from_core() -> dict[str, set[str]]:
    """``{dsh_core module: names}`` that the other packages import (read
    from their source, a lazy import too)."""
    imported: dict[str, set[str]] = {}
    for package in OTHERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None \
                        and node.module.split(".")[0] == "dsh_core":
                    imported.setdefault(node.module, set()).update(alias.name for alias in node.names)
    return imported


def _check_pin(module: ModuleType) -> None:
    pin = PINS / f"{module.__name__}.txt"
    shown = pin.relative_to(PINS.parents[3])
    pinned = pin.read_text("utf-8").splitlines() if pin.exists() else []
    exported = set(module.__all__)
    if sorted(exported) != pinned:
        added, removed = sorted(exported - set(pinned)), sorted(set(pinned) - exported)
        pytest.fail(f"the public API of {module.__name__} no longer matches {shown}: exported but not pinned "
                    f"{added}, pinned but not exported {removed}. If the change is deliberate, edit {shown} "
                    "to list __all__ (one name a line, sorted) in the same commit as the change.")


def _bound_public_names(module: ModuleType) -> set[str]:
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)} - {"annotations"}


@pytest.mark.parametrize("module", [dsh_core, dsh_core.formats, dsh_core.migration, dsh_core.storage],
                         ids=lambda m: m.__name__)
def test_exports_are_pinned(module):
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), f"{module.__name__}.__all__ lists a name twice"
    assert exported == _bound_public_names(module), (
        f"{module.__name__}.__all__ must list exactly the public names its __init__ binds")
    for name in module.__all__:
        assert hasattr(module, name), f"{module.__name__}.{name} does not resolve"
    _check_pin(module)


@pytest.mark.parametrize("name", sorted(_imported_from_core()))
def test_what_other_packages_import_is_pinned(name):
    module = importlib.import_module(name)
    exported = set(getattr(module, "__all__", ()))
    for imported in sorted(_imported_from_core()[name]):
        assert imported in exported, (f"{name}.{imported} is imported by another package but is not in "
                                      f"{name}.__all__: export and pin it, or import it from where it is public")
        assert hasattr(module, imported), f"{name}.{imported} does not resolve"
    _check_pin(module)


def test_the_names_other_packages_import_are_pinned():
    """Every dsh_core name another package imports is listed in
    ``imported.txt`` (``module.name``, one a line)."""
    imported = {f"{module}.{name}" for module, names in _imported_from_core().items() for name in names}
    pinned = IMPORTED_PIN.read_text("utf-8").splitlines()
    shown = IMPORTED_PIN.relative_to(PINS.parents[3])
    if sorted(imported) != pinned:
        added, removed = sorted(imported - set(pinned)), sorted(set(pinned) - imported)
        pytest.fail(f"the dsh_core names other packages import no longer match {shown}: imported but not pinned "
                    f"{added}, pinned but not imported {removed}. If the change is deliberate, edit {shown} (one "
                    "module.name a line, sorted) in the same commit.")


def test_error_tree_and_categories():
    assert issubclass(dsh_core.SurfaceError, dsh_core.ValidationError)
    assert issubclass(dsh_core.ValidationError, dsh_core.DshError)
    assert dsh_core.CorruptionError("x").category == "corrupt-storage"
    assert dsh_core.FormatUnsupportedError("x").category == "unsupported-format"
    assert dsh_core.SurfaceError("x").category == "invalid-log"
    assert str(dsh_core.SequenceGapError("s", 3, 5, "dsh.session-events[2]@17")) == (
        "session 's': expected seq 3, got 5 at dsh.session-events[2]@17")
