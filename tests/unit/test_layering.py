"""The direction of imports (docs/concepts/architecture.md): the domain knows nothing
of Kafka, the Kafka edge nothing of the services, the services nothing of
the command line. Read from the source, so a lazy import counts too."""

from __future__ import annotations

import ast
import re
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


#: Words of the Kafka edge that no identifier of the domain may hold: the domain speaks of logs,
#: sessions and seqs (a consumer group is a "group"; "grouped" and "groupby" are other words).
EDGE_WORDS = re.compile(r"kafka|broker|cluster|partition|topic|(?<![a-z])groups?(?![a-z])|consumer_group|groupid",
                        re.IGNORECASE)


def _words(name: str) -> str:
    """``name`` with its camelCase humps split by ``_``, so ``groupId`` reads ``group_Id``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)


def _bound_names(tree: ast.AST) -> list[tuple[int, str]]:
    """The names a module binds or imports: classes, functions, parameters,
    variables and attributes assigned, imports (reading another's name,
    ``bytes.partition``, is not naming)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        match node:
            case ast.ClassDef(name=name) | ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                found.append((node.lineno, name))
            case ast.arg(arg=name):
                found.append((node.lineno, name))
            case ast.Name(id=name, ctx=ast.Store() | ast.Del()):
                found.append((node.lineno, name))
            case ast.Attribute(attr=name, ctx=ast.Store() | ast.Del()):
                found.append((node.lineno, name))
            case ast.Import(names=aliases) | ast.ImportFrom(names=aliases):
                found.extend((node.lineno, part) for alias in aliases for part in (alias.name, alias.asname) if part)
                if isinstance(node, ast.ImportFrom) and node.module:
                    found.append((node.lineno, node.module))
    return found


def test_the_domain_names_no_kafka_concept() -> None:
    """No identifier in dsh_core (class, function, variable, parameter,
    attribute, import) speaks of Kafka, brokers, clusters, partitions, topics
    or consumer groups (prose may)."""
    named = [f"{path.relative_to(ROOT)}:{line} {name}"
             for path in sorted((ROOT / "dsh_core").rglob("*.py"))
             for line, name in _bound_names(ast.parse(path.read_text(), str(path)))
             if EDGE_WORDS.search(_words(name))]
    assert not named, "\n".join(named)


def test_bound_names_are_found() -> None:
    tree = ast.parse("import aiokafka as k\nfrom a.kafka import b\nclass C:\n  def f(self, group): self.topic = 1\n"
                     "x = 1\nhead, _, tail = b'a'.partition(b'=')\n")
    assert {name for _, name in _bound_names(tree)} == {
        "aiokafka", "k", "a.kafka", "b", "C", "f", "self", "group", "topic", "x", "head", "_", "tail"}


@pytest.mark.parametrize("name", ["KafkaRecord", "broker_id", "ClusterUnavailableError", "partition", "topic_names",
                                  "group", "groupId", "consumer_groups", "BrokerAbsentError", "make_kafka"])
def test_edge_words_are_caught(name: str) -> None:
    assert EDGE_WORDS.search(_words(name))


@pytest.mark.parametrize("name", ["grouped", "regroup", "session_id", "seq", "SessionFold", "groupby"])
def test_domain_words_pass(name: str) -> None:
    assert not EDGE_WORDS.search(_words(name))
