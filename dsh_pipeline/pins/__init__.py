"""SHA-256 of every artifact the project downloads, checked before use.

The pins are data files beside this module, one per download, in
``sha256sum`` format (``<hex digest>  <file name>``): a file whose bytes do
not match its pin, a file with no pin, or a pinned file that is missing is
refused by name (which file, expected and got), whatever fetched it
(Maven, pip, npm). The registries' own checks come first; these are the
repository's, and the last word.

* ``kafka-<version>.sha256``: the broker's jars, exactly the folder's set;
* ``dsh-runtimes.sha256``: the ``deepseek-harness-runtime-bin`` wheels.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dsh_core.errors import PipelineError

__all__ = ["ArtifactRefusedError", "pinned", "sha256_of", "verify_file", "verify_folder"]

PINS = Path(__file__).resolve().parent


class ArtifactRefusedError(PipelineError):
    """A downloaded file is not what the repository pins."""


def pinned(name: str) -> dict[str, str]:
    """The pins file ``name``: each pinned file name and its SHA-256 (hex)."""
    pins = {}
    for number, line in enumerate((PINS / name).read_text().splitlines(), 1):
        digest, _, file = line.partition("  ")
        if len(digest) != 64 or not file:
            raise PipelineError(f"{PINS / name}:{number}: expected '<sha256 hex>  <file name>', got {line!r}")
        pins[file] = digest
    return pins


def sha256_of(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def verify_file(path: Path, pins_name: str) -> None:
    """Refuse ``path`` unless the pins file ``pins_name`` pins its name to its bytes."""
    expected = pinned(pins_name).get(path.name)
    if expected is None:
        raise ArtifactRefusedError(f"{path}: no SHA-256 for {path.name} is pinned in {PINS / pins_name}: refused "
                                   "(pin the file's hash there to use it)")
    _check(path, expected, pins_name, "")


def verify_folder(folder: Path, pins_name: str) -> None:
    """Refuse ``folder`` unless it holds exactly the files the pins file
    ``pins_name`` pins, each with its pinned bytes."""
    pins = pinned(pins_name)
    present = {path.name for path in folder.iterdir()}
    extra, missing = sorted(present - pins.keys()), sorted(pins.keys() - present)
    if extra or missing:
        raise ArtifactRefusedError(
            f"{folder} is not the pinned set of {PINS / pins_name}: "
            + "; ".join(part for part in (f"not pinned: {', '.join(extra)}" if extra else "",
                                          f"missing: {', '.join(missing)}" if missing else "") if part)
            + f": refused (remove {folder} to fetch it again)")
    for name, expected in sorted(pins.items()):
        _check(folder / name, expected, pins_name, f" (remove {folder} to fetch it again)")


def _check(path: Path, expected: str, pins_name: str, remedy: str) -> None:
    got = sha256_of(path)
    if got != expected:
        raise ArtifactRefusedError(f"{path}: SHA-256 {got}, expected {expected} (pinned in {PINS / pins_name}): "
                                   f"{path.name} was altered or is not the pinned release: refused{remedy}")
