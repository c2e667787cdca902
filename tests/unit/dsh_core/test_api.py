"""The public surface of dsh_core is pinned: changing it is a decision.

Each package's ``__all__`` must be exactly the public names it binds, and
the sorted list must match its pin file in ``tests/unit/dsh_core/api/``;
every dsh_core name the other packages import is pinned in ``imported.txt``
and listed in its module's ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest

import dsh_core
import dsh_core.storage

PINS = Path(__file__).parent / "api"


def _bound_public_names(module: ModuleType) -> set[str]:
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)} - {"annotations"}


@pytest.mark.parametrize("module", [dsh_core, dsh_core.storage], ids=lambda m: m.__name__)
def test_exports_are_pinned(module):
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), f"{module.__name__}.__all__ lists a name twice"
    assert exported == _bound_public_names(module), (
        f"{module.__name__}.__all__ must list exactly the public names its __init__ binds")
    for name in module.__all__:
        assert hasattr(module, name), f"{module.__name__}.{name} does not resolve"
    pin = PINS / f"{module.__name__}.txt"
    shown = pin.relative_to(PINS.parents[3])
    pinned = pin.read_text("utf-8").splitlines()
    if sorted(exported) != pinned:
        added, removed = sorted(exported - set(pinned)), sorted(set(pinned) - exported)
        pytest.fail(f"the public API of {module.__name__} no longer matches {shown}: exported but not pinned "
                    f"{added}, pinned but not exported {removed}. If the change is deliberate, edit {shown} "
                    "to list __all__ (one name a line, sorted) in the same commit as the change.")


def test_error_tree_and_categories():
    assert issubclass(dsh_core.SurfaceError, dsh_core.ValidationError)
    assert issubclass(dsh_core.ValidationError, dsh_core.DshError)
    assert dsh_core.CorruptionError("x").category == "corrupt-storage"
    assert dsh_core.FormatUnsupportedError("x").category == "unsupported-format"
    assert dsh_core.SurfaceError("x").category == "invalid-log"
    assert str(dsh_core.SequenceGapError("s", 3, 5, "dsh.session-events[2]@17")) == (
        "session 's': expected seq 3, got 5 at dsh.session-events[2]@17")


#: The packages built on dsh_core (docs/concepts/architecture.md).
DEPENDENTS = ("dsh_kafka", "producers", "consumers", "dsh_pipeline")
IMPORTED_PIN = PINS / "imported.txt"


def _imported_from_dsh_core() -> set[str]:
    """``module.name`` of every dsh_core name the dependent packages import,
    read from their source (a lazy import counts too)."""
    root = Path(dsh_core.__file__).resolve().parents[1]
    found = set()
    for package in DEPENDENTS:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.split(".")[0] == "dsh_core":
                    found.update(f"{node.module}.{alias.name}" for alias in node.names)
                elif isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "dsh_core")
    return found


def test_what_other_packages_import_is_pinned():
    """Every dsh_core name another package imports is pinned: depending on
    one more is a decision, made by editing the pin in the same commit."""
    imported = _imported_from_dsh_core()
    pinned = IMPORTED_PIN.read_text("utf-8").splitlines()
    shown = IMPORTED_PIN.relative_to(PINS.parents[3])
    if sorted(imported) != pinned:
        added, removed = sorted(imported - set(pinned)), sorted(set(pinned) - imported)
        pytest.fail(f"the dsh_core names other packages import no longer match {shown}: imported but not pinned "
                    f"{added}, pinned but not imported {removed}. If the change is deliberate, edit {shown} (one "
                    "module.name a line, sorted) in the same commit.")


@pytest.mark.parametrize("qualified", IMPORTED_PIN.read_text("utf-8").splitlines())
def test_a_pinned_import_is_exported_by_its_module(qualified: str):
    """What other packages import is public where it lives: it resolves and
    its module's ``__all__`` lists it."""
    module_name, _, name = qualified.rpartition(".")
    module = importlib.import_module(module_name)
    assert hasattr(module, name), f"{qualified} does not resolve"
    assert name in getattr(module, "__all__", [name]), f"{module_name}.__all__ does not list {name}"
