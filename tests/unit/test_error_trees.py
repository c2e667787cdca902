"""Each errors module draws its tree at the top: the drawing is the tree
there is, every class is exported and has a known category, and each
branch hangs under the one root, so ``except DshError`` takes them all."""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from types import ModuleType

import pytest

from dsh_core.errors import Category, DshError, PipelineError

#: The errors modules, each next to the layer that raises its errors.
MODULES = ("dsh_core.errors", "dsh_kafka.errors", "consumers.runtime.errors", "producers.errors")


def _classes(module: ModuleType) -> dict[str, type[DshError]]:
    return {name: cls for name, cls in vars(module).items()
            if inspect.isclass(cls) and issubclass(cls, DshError) and cls.__module__ == module.__name__}


def _drawn(module: ModuleType) -> dict[str, str | None]:
    """Class name -> parent name, read from the module docstring's drawing."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (module.__doc__ or "").splitlines():
        match = re.match(r"^[ │├└─]*([A-Z]\w*Error)\b", line)
        if match is None:
            continue
        depth, name = match.start(1), match.group(1)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


@pytest.mark.parametrize("name", MODULES)
def test_the_drawing_is_the_tree(name: str) -> None:
    module = importlib.import_module(name)
    classes = _classes(module)
    actual = {cls_name: (cls.__base__.__name__ if cls is not DshError else None)
              for cls_name, cls in classes.items()}
    drawn = {cls_name: parent for cls_name, parent in _drawn(module).items() if cls_name in classes}
    assert drawn == actual


@pytest.mark.parametrize("name", MODULES)
def test_every_error_is_exported_and_every_category_is_a_known_word(name: str) -> None:
    module = importlib.import_module(name)
    categories = set(typing.get_args(Category))
    for cls_name, cls in _classes(module).items():
        assert cls_name in module.__all__
        assert cls.category in categories, (cls_name, cls.category)


@pytest.mark.parametrize("name", MODULES[1:])
def test_infrastructure_errors_are_pipeline_errors(name: str) -> None:
    module = importlib.import_module(name)
    assert _classes(module)
    for cls_name, cls in _classes(module).items():
        assert issubclass(cls, PipelineError), cls_name
        assert cls("x").category == "pipeline"
