"""Regenerate the corpus's ``NAME.expected.json`` from the pinned reference.

    python -m tests.corpus.regenerate           # rewrite every expected.json
    python -m tests.corpus.regenerate --check   # compare instead; list differences

``tools/reference/corpus.mjs`` loads each log with the published dsh packages
pinned in ``tools/reference/package.json`` (installed by ``make reference``)
under the Node 22 the oracle tests install (:mod:`tests.oracle.extract`):
the JSONL persistence package needs Node 22's Zstandard functions. Files are
written as ``json.dumps(indent=1, ensure_ascii=False)`` plus a newline, the
form they are committed in; ``--check`` compares canonical JSON
(:func:`tests.conftest.canonical`) field by field.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, canonical, corpus_logs, expected_of
from tests.differential.reference import REFERENCE_DIR
from tests.oracle.extract import OracleUnavailableError, node_binary, oracle_dir

__all__ = ["ReferenceUnavailableError", "differences", "reference_node", "regenerate"]

GENERATOR = ROOT / "tools" / "reference" / "corpus.mjs"
PINS = ROOT / "tools" / "reference" / "package.json"
FOLDERS = ("dsh-real", "dsh-negative")
TIMEOUT_S = 900


class ReferenceUnavailableError(RuntimeError):
    """Node 22 or the pinned packages are not here; ``str()`` is one line."""


def reference_node() -> Path:
    """The Node 22 binary to run the generator with, once the pinned packages
    are known to be installed; raises :class:`ReferenceUnavailableError`."""
    _check_pins()
    try:
        return node_binary(oracle_dir())
    except OracleUnavailableError as error:
        raise ReferenceUnavailableError(f"Node 22 cannot be installed: {error}") from None


def _check_pins() -> None:
    pins = json.loads(PINS.read_text("utf-8"))["dependencies"]
    for name, version in pins.items():
        manifest = REFERENCE_DIR / "node_modules" / name / "package.json"
        try:
            installed = json.loads(manifest.read_text("utf-8"))["version"]
        except (OSError, ValueError, KeyError):
            installed = None
        if installed != version:
            found = "is not installed" if installed is None else f"is {installed}"
            raise ReferenceUnavailableError(
                f"{name} under {REFERENCE_DIR} {found}, {PINS.relative_to(ROOT)} pins {version}: run `make reference`")


def regenerate(logs: list[Path]) -> dict[Path, dict]:
    """What the pinned reference makes of each log, keyed by the log's path.

    Raises :class:`ReferenceUnavailableError` when Node 22 or the pinned
    packages are missing, :class:`RuntimeError` when the generator fails."""
    argv = [str(reference_node()), str(GENERATOR), str(REFERENCE_DIR), *map(str, logs)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no stderr"]
        raise RuntimeError(f"{GENERATOR.name} exited {done.returncode}: {tail[0]}")
    results = [json.loads(line) for line in done.stdout.splitlines()]
    if [result["log"] for result in results] != list(map(str, logs)):
        raise RuntimeError(f"{GENERATOR.name} answered for {len(results)} of {len(logs)} logs")
    return {log: result["expected"] for log, result in zip(logs, results)}


def differences(log: Path, regenerated: dict) -> list[str]:
    """The fields whose canonical JSON differs from the committed file's."""
    try:
        committed = expected_of(log)
    except FileNotFoundError:
        return ["no expected.json"]
    fields = list(dict.fromkeys([*committed, *regenerated]))
    return [field for field in fields
            if field not in committed or field not in regenerated
            or canonical(committed[field]) != canonical(regenerated[field])]


def _expected_path(log: Path) -> Path:
    return log.with_name(log.stem + ".expected.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.corpus.regenerate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead of writing them")
    parser.add_argument("logs", nargs="*", type=Path, help="NAME.jsonl files (default: the whole corpus)")
    args = parser.parse_args(argv)
    for log in args.logs:
        if log.suffix != ".jsonl" or not log.is_file():
            parser.error(f"{log}: not a NAME.jsonl corpus log")
    logs = args.logs or corpus_logs(*FOLDERS)
    try:
        results = regenerate(logs)
    except ReferenceUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.check:
        for log, expected in results.items():
            _expected_path(log).write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", "utf-8")
        print(f"wrote {len(results)} expected.json files")
        return 0
    failing = 0
    for log, expected in results.items():
        if fields := differences(log, expected):
            failing += 1
            print(f"{_expected_path(log)}: differs in {', '.join(fields)}")
    print(f"{len(results) - failing} of {len(results)} expected.json files match")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
