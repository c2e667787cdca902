"""Real dsh runtime executables, fetched once from PyPI by pinned version.

``runtime_executable("0.2.1rc2")`` downloads the wheel
``deepseek-harness-runtime-bin==0.2.1rc2`` with ``python -m pip download
--no-deps --pre``, unzips it into the user cache and returns the CLI inside::

    $XDG_CACHE_HOME/dsh-pipeline/runtimes/<version>/    (~/.cache/... by default)
        deepseek_harness_runtime/runtime/deepseek-harness-sdk-runtime-linux-x64
        .complete                                       written last

A file lock serialises concurrent callers; every later call only checks the
marker. The 0.1.2+ wheels (``0.1.5rc1``, ``0.2.1rc2``) ship this executable;
older ones ship a JSON-RPC agent under another name and are refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dsh_core.errors import PipelineError

__all__ = ["EXECUTABLE_IN_WHEEL", "WHEEL_PROJECT", "runtime_executable", "runtimes_root"]

WHEEL_PROJECT = "deepseek-harness-runtime-bin"
EXECUTABLE_IN_WHEEL = "deepseek_harness_runtime/runtime/deepseek-harness-sdk-runtime-linux-x64"
_MARKER = ".complete"
_DOWNLOAD_TIMEOUT_S = 900


def runtimes_root() -> Path:
    """``$XDG_CACHE_HOME/dsh-pipeline/runtimes`` (``~/.cache/...`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsh-pipeline" / "runtimes"


def runtime_executable(version: str) -> Path:
    """The dsh runtime CLI of ``version``, downloading and unpacking it first
    when the cache lacks it. Raises :class:`PipelineError` (one line, naming
    the version) when pip, the download, the wheel or the executable fails."""
    if not version or "/" in version or version.startswith("."):
        raise PipelineError(f"dsh runtime version {version!r} is not a version number")
    root = runtimes_root() / version
    executable = root / EXECUTABLE_IN_WHEEL
    if (root / _MARKER).is_file() and executable.is_file():
        return executable
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ((root / _MARKER).is_file() and executable.is_file()):
            _install(version, root)
    return executable


def _install(version: str, root: Path) -> None:
    requirement = f"{WHEEL_PROJECT}=={version}"
    with tempfile.TemporaryDirectory(prefix="download-", dir=root) as download:
        wheel = _download(requirement, version, Path(download))
        with zipfile.ZipFile(wheel) as archive:
            if EXECUTABLE_IN_WHEEL not in archive.namelist():
                raise PipelineError(f"dsh runtime {version}: wheel {wheel.name} has no {EXECUTABLE_IN_WHEEL}")
            try:
                archive.extractall(root)  # overwrites what an interrupted earlier unpack left
            except (OSError, zipfile.BadZipFile) as exc:
                raise PipelineError(f"dsh runtime {version}: unpacking {wheel.name} failed: {exc}") from None
            for entry in archive.infolist():  # zipfile drops the unix modes; put the executable bits back
                mode = entry.external_attr >> 16
                if mode & 0o111 or entry.filename == EXECUTABLE_IN_WHEEL:
                    target = root / entry.filename
                    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        (root / _MARKER).write_text(json.dumps({"requirement": requirement, "wheel": wheel.name}) + "\n")


def _download(requirement: str, version: str, into: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--pre", "--disable-pip-version-check",
            "--only-binary", ":all:", "-d", str(into), requirement]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise PipelineError(f"dsh runtime {version}: pip download {requirement} timed out "
                            f"after {_DOWNLOAD_TIMEOUT_S} s") from None
    except OSError as exc:
        raise PipelineError(f"dsh runtime {version}: cannot run pip ({sys.executable}): {exc}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in lines if line.startswith("ERROR:")), lines[-1] if lines else "no output")
        raise PipelineError(f"dsh runtime {version}: pip download {requirement} failed "
                            f"(exit {done.returncode}): {reason}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise PipelineError(f"dsh runtime {version}: pip download {requirement} left {len(wheels)} wheels, "
                            "expected 1")
    return wheels[0]
