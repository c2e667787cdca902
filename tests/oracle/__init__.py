"""dsh 0.2.1rc2's own session reader, run under Node 22, as a test oracle.

``run_oracle(root)`` reads every session under a sessions root with dsh's JSONL
persistence and returns, per session id, what ``read.mjs`` prints: dsh's
verdict (``ok`` or ``{stage, category, name, message}``) and, for a readable
log, its header, events (v0/v3 migrated in memory), surface, derived messages,
folded request header and system prompt. ``place_log`` copies a log file
into the layout dsh requires (``<root>/<projectKey(cwd)>/<id>/<file name>``).

Tests skip on :class:`OracleUnavailableError` (``str()`` is one line)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.oracle.extract import OracleUnavailableError, node_binary, node_modules, oracle_dir

__all__ = [
    "OracleError",
    "OracleUnavailableError",
    "encode_segment",
    "place_log",
    "project_key",
    "run_oracle",
    "session_dir",
]

READ_SCRIPT = Path(__file__).with_name("read.mjs")
DEFAULT_TIMEOUT_S = 120.0


class OracleError(RuntimeError):
    """The oracle process itself failed (crash, timeout, unparsable output);
    a log dsh refuses is a normal result, not this error."""


def run_oracle(root: Path, ids: list[str] | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, dict]:
    """dsh's reading of the sessions under ``root``, keyed by session id.

    ``ids`` picks sessions (in that order); ``None`` reads every session
    directory. Raises :class:`OracleUnavailableError` when the oracle cannot
    be installed, :class:`OracleError` when the Node process fails."""
    folder = oracle_dir()
    argv = [str(node_binary(folder)), str(READ_SCRIPT), str(node_modules(folder)), str(root), *(ids or [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise OracleError(f"dsh oracle timed out after {timeout} s on {root}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no stderr"]
        raise OracleError(f"dsh oracle exited {done.returncode} on {root}: {tail[0]}")
    results: dict[str, dict] = {}
    for number, line in enumerate(done.stdout.splitlines(), start=1):
        try:
            result = json.loads(line)
        except ValueError as error:
            raise OracleError(f"dsh oracle output line {number} is not JSON: {error}") from None
        results[result["id"]] = result
    return results


def encode_segment(raw: str) -> str:
    """dsh's ``encodeSegment``: keep ``[A-Za-z0-9._-]``, escape every other
    UTF-16 code unit as ``~XXXX``."""
    if not raw:
        raise ValueError("cannot encode an empty path segment")
    if raw == ".":
        return "~002E"
    if raw == "..":
        return "~002E~002E"
    return "".join(unit if _safe(unit) else f"~{ord(unit):04X}" for unit in _utf16_units(raw))


def project_key(cwd: str) -> str:
    """dsh's ``projectKey``: separators ``/ \\ :`` collapse to one ``-``,
    unsafe code units become ``~XXXX``, at most 251 characters."""
    if not cwd:
        raise ValueError("cannot encode an empty project path")
    readable: list[str] = []
    separator_run = False
    for unit in _utf16_units(cwd):
        if unit in "/\\:":
            if not separator_run:
                readable.append("-")
            separator_run = True
        else:
            readable.append(unit if _safe(unit) else f"~{ord(unit):04X}")
            separator_run = False
    key = "".join(readable).lstrip("-") or "root"
    return f"--{key[:251]}--"


def session_dir(root: Path, cwd: str | None, session_id: str) -> Path:
    """``<root>/<projectKey(cwd)>/<encodeSegment(id)>`` (``_no-cwd`` without cwd)."""
    project = "_no-cwd" if cwd is None else project_key(cwd)
    return root / project / encode_segment(session_id)


def place_log(source: Path, root: Path, name: str | None = None) -> str:
    """Copy a ``session(.vN).jsonl.zstd`` file to where dsh looks for it and
    return its session id (read from the header line). ``name`` overrides
    the file name, which otherwise is the generation the header declares."""
    header = _first_line(source)
    version = header.get("version")
    file_name = name or ("session.jsonl.zstd" if version == 0 else f"session.v{version}.jsonl.zstd")
    target = session_dir(root, header.get("cwd"), header["id"])
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target / file_name)
    return header["id"]


def _first_line(path: Path) -> dict:
    import zstandard

    with open(path, "rb") as handle:
        reader = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=False)
        head = reader.read(1 << 20)
    return json.loads(head.split(b"\n", 1)[0])


def _utf16_units(text: str) -> list[str]:
    data = text.encode("utf-16-le", "surrogatepass")
    return [chr(int.from_bytes(data[i:i + 2], "little")) for i in range(0, len(data), 2)]


def _safe(unit: str) -> bool:
    return unit != "~" and (unit.isascii() and (unit.isalnum() or unit in "._-"))
