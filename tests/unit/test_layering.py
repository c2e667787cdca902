"""The direction of imports (docs/concepts/architecture.md): the domain knows nothing
of Kafka, the Kafka edge nothing of the services, the services nothing of
the command line. Read from the source, so a lazy import counts too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dsh_core", "dsh_kafka", "producers", "consumers", "dsh_pipeline")
#: What each package may import besides the standard library and itself.
ALLOWED = {
    "dsh_core": {"msgspec", "zstandard"},
    "dsh_kafka": {"dsh_core", "msgspec", "aiokafka", "tenacity"},
    "producers": {"dsh_core", "dsh_kafka", "msgspec", "aiokafka", "prometheus_client", "zstandard",
                  "deepseek_harness_runtime",  # the bridge finds the installed dsh runtime
                  "aiohttp", "uvicorn",  # the gateway's upstream client and its ASGI server
                  "inotify_simple"},  # the following shipper's watches
    "consumers": {"dsh_core", "dsh_kafka", "msgspec", "aiokafka", "prometheus_client", "zstandard",
                  "psycopg", "psycopg_pool",  # the view store on PostgreSQL
                  "opentelemetry"},  # export-otel's OTLP exporter (the otel extra)
    "dsh_pipeline": set(PACKAGES) | {"msgspec", "aiokafka", "prometheus_client", "zstandard", "psycopg",
                                     "fastapi", "starlette",  # the read API and the viewer (FastAPI is Starlette)
                                     "itsdangerous",  # the viewer's signed session cookies
                                     "uvloop",  # the event loop of the long-running commands
                                     "pyarrow"},  # export --format parquet (the export extra)
}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_layers(package: str) -> None:
    allowed = ALLOWED[package] | {package} | set(sys.stdlib_module_names)
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sorted((ROOT / package).rglob("*.py")) for line, name in _imports(path) if name not in allowed]
    assert not wrong, "\n".join(wrong)


def test_the_domain_names_no_kafka_concept() -> None:
    """No identifier in dsh_core speaks of Kafka (prose may)."""
    named = []
    for path in sorted((ROOT / "dsh_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [getattr(node, attr, None) for attr in ("id", "attr", "name", "arg", "module")]
            names += [alias.name for alias in getattr(node, "names", ()) if isinstance(alias, ast.alias)]
            named.extend(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')} {name}"
                         for name in names if isinstance(name, str) and "kafka" in name.lower())
    assert not named, "\n".join(named)
