"""Pages of the documentation drawn from the code: ``python docs/generate.py``
rewrites them, and ``tests/docs`` fails while a committed page differs.

* ``reference/errors.md``: the error tree, every subclass of
  :class:`dsh_core.errors.DshError` in the project's packages, with its
  category, module and the first sentence of its docstring.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PACKAGES = ("dsh_core", "dsh_kafka", "producers", "consumers", "dsh_pipeline")


def _import_everything() -> None:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            importlib.import_module(module.name)


def _summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _tree(cls: type, depth: int) -> list[str]:
    lines = [f"{'  ' * depth}- `{cls.__name__}` (`{getattr(cls, 'category', '')}`, `{cls.__module__}`): {_summary(cls)}"]
    for child in sorted(cls.__subclasses__(), key=lambda c: c.__name__):
        if child.__module__.split(".")[0] in PACKAGES and not child.__name__.startswith("_"):
            lines.extend(_tree(child, depth + 1))
    return lines


def errors_page() -> str:
    _import_everything()
    from dsh_core.errors import DshError

    return "\n".join([
        "# Errors",
        "",
        "Every error the project raises is a `DshError`. A person sees",
        "`dsh-pipeline COMMAND: ErrorClass: message`, never a traceback; the",
        "message names what was expected, what was found and where. The category",
        "is the word a dead letter's `dsh-dlq-reason`, a finding and",
        "`inspect --json` use. This page is drawn from the code (`python docs/generate.py`).",
        "",
        "Each entry: the class, its category and module, and when it is raised.",
        "",
        *_tree(DshError, 0),
        "",
    ])


PAGES = {"reference/errors.md": errors_page}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    for name, build in PAGES.items():
        (DOCS / name).write_text(build(), encoding="utf-8")
        print(f"wrote docs/{name}")


if __name__ == "__main__":
    main()
