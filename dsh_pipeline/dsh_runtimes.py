"""Real dsh runtime executables, fetched once from PyPI by pinned version.

``runtime_executable("0.2.1rc2")`` downloads the wheel
``deepseek-harness-runtime-bin==0.2.1rc2`` with ``python -m pip download
--no-deps --pre``, unzips it into the user cache and returns the CLI inside::

    $XDG_CACHE_HOME/dsh-pipeline/runtimes/<version>/    (~/.cache/... by default)
        deepseek_harness_runtime/runtime/deepseek-harness-sdk-runtime-linux-x64
        .complete                                       written last

The wheel is unpacked only once its SHA-256 matches the repository's pin,
:mod:`dsh_pipeline.pins` ``dsh-runtimes.sha256``: a release with no pin, or
a wheel whose bytes differ, is refused by name. A file lock serialises
concurrent callers; every later call only checks the marker. Each release line ships one of two executables, and the one the wheel
holds is the one returned (the marker records which):

| releases | executable | driven |
|---|---|---|
| 0.1.0rc6, 0.1.0rc7, 0.1.1rc1 | ``dsh-jsonrpc-agent-pkg-linux-x64`` with ``cordis.yml`` beside it | JSON-RPC on stdio (:class:`producers.bridge.WorkerBridge`) |
| 0.1.2a3 and later | ``deepseek-harness-sdk-runtime-linux-x64`` (CLI ``dsh``) | ``--profile sdk`` (JSON-RPC) or ``--profile headless`` |

``jsonrpc_agent(version)`` is the first kind with its ``cordis.yml``, for the
releases before the CLI.
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
from dsh_pipeline.pins import verify_file

__all__ = ["EXECUTABLE_IN_WHEEL", "JSONRPC_AGENT_IN_WHEEL", "WHEEL_PINS", "WHEEL_PROJECT", "jsonrpc_agent",
           "runtime_executable", "runtimes_root"]

WHEEL_PROJECT = "deepseek-harness-runtime-bin"
EXECUTABLE_IN_WHEEL = "deepseek_harness_runtime/runtime/deepseek-harness-sdk-runtime-linux-x64"
JSONRPC_AGENT_IN_WHEEL = "deepseek_harness_runtime/runtime/dsh-jsonrpc-agent-pkg-linux-x64"
_EXECUTABLES = (EXECUTABLE_IN_WHEEL, JSONRPC_AGENT_IN_WHEEL)  # the first a wheel holds is its runtime
_MARKER = ".complete"
WHEEL_PINS = "dsh-runtimes.sha256"  # in dsh_pipeline/pins
_DOWNLOAD_TIMEOUT_S = 900


def runtimes_root() -> Path:
    """``$XDG_CACHE_HOME/dsh-pipeline/runtimes`` (``~/.cache/...`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsh-pipeline" / "runtimes"


def runtime_executable(version: str) -> Path:
    """The dsh runtime executable of ``version`` (the CLI from 0.1.2 on, the
    JSON-RPC agent before it), downloading and unpacking the wheel first when
    the cache lacks it. Raises :class:`PipelineError` (one line, naming the
    version) when pip, the download, the wheel or the executable fails."""
    if not version or "/" in version or version.startswith("."):
        raise PipelineError(f"dsh runtime version {version!r} is not a version number")
    root = runtimes_root() / version
    executable = _installed(root)
    if executable is not None:
        return executable
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        executable = _installed(root) or _install(version, root)
    return executable


def jsonrpc_agent(version: str) -> tuple[Path, Path]:
    """The JSON-RPC agent of a release before the CLI (0.1.0rc6 to 0.1.1rc1)
    and the ``cordis.yml`` beside it, as :class:`producers.bridge.RuntimeConfig`
    takes them; :class:`PipelineError` for a release that ships the CLI."""
    executable = runtime_executable(version)
    if executable.name != Path(JSONRPC_AGENT_IN_WHEEL).name:
        raise PipelineError(f"dsh runtime {version} ships {executable.name}, not the JSON-RPC agent "
                            f"{Path(JSONRPC_AGENT_IN_WHEEL).name}: drive it with --profile sdk")
    cordis = executable.with_name("cordis.yml")
    if not cordis.is_file():
        raise PipelineError(f"dsh runtime {version}: no cordis.yml beside {executable}")
    return executable, cordis


def _installed(root: Path) -> Path | None:
    """The executable a completed unpack recorded (markers written before
    the JSON-RPC agent was known name none: the CLI), or None."""
    try:
        marker = json.loads((root / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    executable = root / marker.get("executable", EXECUTABLE_IN_WHEEL)
    return executable if executable.is_file() else None


def _install(version: str, root: Path) -> Path:
    requirement = f"{WHEEL_PROJECT}=={version}"
    with tempfile.TemporaryDirectory(prefix="download-", dir=root) as download:
        wheel = _download(requirement, version, Path(download))
        with zipfile.ZipFile(wheel) as archive:
            inside = next((name for name in _EXECUTABLES if name in archive.namelist()), None)
            if inside is None:
                raise PipelineError(f"dsh runtime {version}: wheel {wheel.name} has none of "
                                    f"{', '.join(_EXECUTABLES)}")
            try:
                archive.extractall(root)  # overwrites what an interrupted earlier unpack left
            except (OSError, zipfile.BadZipFile) as exc:
                raise PipelineError(f"dsh runtime {version}: unpacking {wheel.name} failed: {exc}") from None
            for entry in archive.infolist():  # zipfile drops the unix modes; put the executable bits back
                mode = entry.external_attr >> 16
                if mode & 0o111 or entry.filename == inside:
                    target = root / entry.filename
                    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        (root / _MARKER).write_text(json.dumps({"requirement": requirement, "wheel": wheel.name,
                                                "executable": inside}) + "\n")
    return root / inside


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
    verify_file(wheels[0], WHEEL_PINS)
    return wheels[0]
