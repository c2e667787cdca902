"""dsh's session directory layout (docs/formats/v0.md §8.1).

::

    <root>/<project_key(cwd) | "_no-cwd">/<encode_segment(id)>/session.jsonl[.zstd]
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, Iterator, Literal

from ..errors import CorruptionError, DshError, LayoutError, ValidationError

__all__ = ["LAYOUT", "Compression", "encode_segment", "project_dir", "project_key", "session_dir", "log_path",
           "log_name", "compression_of", "find_session_files", "generation_of"]

Compression = Literal["zstd", "none"]

#: A session log's file name: ``session.jsonl`` (v0) or ``session.v<N>.jsonl``
#: (dsh 0.1.5 and later write v3, 0.2.x v4), plus ``.zstd``.
_LOG_NAME = re.compile(r"session(?:\.v([1-9][0-9]*))?\.jsonl(?:\.zstd)?")

#: dsh's layout, as error messages state it.
LAYOUT = "dsh keeps each session at <root>/<project>/<session-id>/session[.vN].jsonl[.zstd]"

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _units(text: str) -> Iterator[int]:
    raw = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(raw), 2):
        yield raw[i] | (raw[i + 1] << 8)


def encode_segment(raw: str) -> str:
    """Injective escape of any string to one safe path segment: units in
    ``[A-Za-z0-9._-]`` stay, every other UTF-16 unit becomes ``~XXXX``."""
    if raw == "":
        raise ValidationError("cannot encode an empty path segment")
    if raw == ".":
        return "~002E"
    if raw == "..":
        return "~002E~002E"
    return "".join(chr(u) if chr(u) in _SAFE else f"~{u:04X}" for u in _units(raw))


def project_key(cwd: str) -> str:
    """Readable, lossy project directory name of a cwd (``/a/b`` → ``--a-b--``)."""
    if cwd == "":
        raise ValidationError("cannot encode an empty project path")
    out: list[str] = []
    separator_run = False
    for unit in _units(cwd):
        ch = chr(unit)
        if ch in "/\\:":
            if not separator_run:
                out.append("-")
            separator_run = True
        else:
            out.append(ch if ch in _SAFE else f"~{unit:04X}")
            separator_run = False
    readable = "".join(out).lstrip("-") or "root"
    return f"--{readable[:251]}--"


def log_name(compression: Compression, version: int = 0) -> str:
    """The file name of a session log of format ``version`` (dsh's generation naming)."""
    stem = f"session.v{version}.jsonl" if version else "session.jsonl"
    return f"{stem}.zstd" if compression == "zstd" else stem


def is_log_name(name: str) -> bool:
    """Whether ``name`` is a session log's file name, of any generation."""
    return _LOG_NAME.fullmatch(name) is not None


def project_dir(cwd: str | None) -> str:
    """The project folder of a session whose header has ``cwd``."""
    return "_no-cwd" if cwd is None else project_key(cwd)


def session_dir(root: str | os.PathLike[str], cwd: str | None, session_id: str) -> Path:
    return Path(root) / project_dir(cwd) / encode_segment(session_id)


def log_path(root: str | os.PathLike[str], cwd: str | None, session_id: str, compression: Compression,
             version: int = 0) -> Path:
    return session_dir(root, cwd, session_id) / log_name(compression, version)


def compression_of(path: str | os.PathLike[str]) -> Compression:
    """``zstd`` for a ``.zstd`` file name, else ``none``."""
    return "zstd" if str(path).endswith(".zstd") else "none"


def generation_of(path: str | os.PathLike[str]) -> int | None:
    """The format generation a session file's name gives (``session.jsonl``:
    0, ``session.v4.jsonl.zstd``: 4), or ``None`` for another name."""
    named = _LOG_NAME.fullmatch(Path(path).name)
    return int(named[1] or 0) if named else None


def _sorted_entries(folder: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as entries:
        return sorted(entries, key=lambda entry: entry.name)


def _looks_like_log(name: str) -> bool:
    return name.endswith((".jsonl", ".jsonl.zstd"))


#: What one session folder holds: its log, the refusal of what it holds, or nothing.
FolderLog = Path | DshError | None

#: A folder whose mtime is this close to the scan is read again next time:
#: a file added within the file system's timestamp granularity of the scan
#: may leave the mtime as it was.
_RACY_NS = 2_000_000_000


def find_session_files(root: str | os.PathLike[str], refuse: Callable[[DshError], None] | None = None,
                       folders: dict[str, tuple[int, FolderLog]] | None = None) -> list[Path]:
    """Every session file of a sessions root in dsh's layout, sorted.

    A root holds one encoding per session (docs/formats/v0.md §8.1): a session directory
    holding both is refused (:class:`CorruptionError`), and so is a session
    file that is not a regular file and a session id seen before under
    another project (two logs are not one session). A log outside the
    layout is a :class:`LayoutError`: one directly in the root, a session
    folder directly in the root (its project folder missing), a flat
    ``<project>/<id>.jsonl[.zstd]`` file (dsh's obsolete layout). Symbolic
    links are not followed (one could lead out of the root): they are
    refused too. Where dsh migrated a session to a later format, the newest
    generation is the log (dsh writes on there; the older one stays as it
    was). Without ``refuse`` that raises; with it, the entry is passed over
    and ``refuse`` gets the error. Folders are read with ``scandir``; with
    ``folders`` (kept by the caller from one call to the next), a session
    folder whose mtime did not change is not read again: what it held
    stands (files added, removed or renamed in a folder change its mtime).
    """
    def refused(error: DshError) -> None:
        if refuse is None:
            raise error
        refuse(error)

    def linked(entry: os.DirEntry[str]) -> bool:
        if entry.is_symlink():
            refused(CorruptionError(f"{entry.path}: a symbolic link; links in a sessions root are not followed"))
            return True
        return False

    found: list[Path] = []
    first_seen: dict[str, str] = {}  # session folder name -> where it was found first
    racy = time.time_ns() - _RACY_NS
    for project in _sorted_entries(root):
        if linked(project):
            continue
        if not project.is_dir(follow_symlinks=False):
            if _looks_like_log(project.name):
                refused(LayoutError(f"{project.path}: a session log directly in the sessions root; {LAYOUT}"))
            continue
        for entry in _sorted_entries(project.path):
            if linked(entry):
                continue
            if entry.is_file(follow_symlinks=False) and _looks_like_log(entry.name):
                what = ("a session folder directly in the sessions root (its project folder is missing)"
                        if is_log_name(entry.name) else "a flat session file (dsh's obsolete layout)")
                refused(LayoutError(f"{entry.path}: {what}; {LAYOUT}"))
            if not entry.is_dir(follow_symlinks=False):
                continue
            if folders is None:
                log = _session_log(entry.path)
            else:
                mtime = entry.stat(follow_symlinks=False).st_mtime_ns
                known = folders.get(entry.path)
                log = known[1] if known is not None and known[0] == mtime else _session_log(entry.path)
                if mtime < racy:
                    folders[entry.path] = (mtime, log)
            if isinstance(log, DshError):
                refused(log)
            if not isinstance(log, Path):
                continue
            if entry.name in first_seen:
                refused(CorruptionError(f"{entry.path}: session {entry.name!r} is also at {first_seen[entry.name]}; a "
                                        "root holds one log per session id"))
                continue
            first_seen[entry.name] = entry.path
            found.append(log)
    return found


def _session_log(folder: str) -> FolderLog:
    """The log of one session folder (its newest generation), the refusal
    of what it holds, or None."""
    generations: dict[int, list[os.DirEntry[str]]] = {}
    with os.scandir(folder) as children:
        for child in children:
            named = _LOG_NAME.fullmatch(child.name)
            if named:
                generations.setdefault(int(named[1] or 0), []).append(child)
    files = sorted(generations.get(max(generations, default=0), []), key=lambda child: child.name)
    odd = [child for child in files if not child.is_file(follow_symlinks=False)]
    if odd:
        return CorruptionError(f"{odd[0].path}: not a regular file")
    if len(files) == 2:
        return CorruptionError(f"{folder}: holds both {files[0].name} and {files[1].name}")
    return Path(files[0].path) if files else None
