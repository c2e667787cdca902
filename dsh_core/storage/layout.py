"""dsh's session directory layout (docs/formats/v0.md §8.1).

::

    <root>/<project_key(cwd) | "_no-cwd">/<encode_segment(id)>/session.jsonl[.zstd]
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal

from ..errors import CorruptionError, DshError, LayoutError, ValidationError

__all__ = ["LAYOUT", "Compression", "encode_segment", "project_dir", "project_key", "session_dir", "log_path",
           "log_name", "compression_of", "find_session_files", "generation_of", "is_log_name", "SessionRoot"]

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
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except FileNotFoundError:  # removed since it was listed: its parent's next listing says so
        return []


def _looks_like_log(name: str) -> bool:
    return name.endswith((".jsonl", ".jsonl.zstd"))


#: What one session folder holds: its log, the refusal of what it holds, or nothing.
FolderLog = Path | DshError | None

#: A folder whose mtime is this close to the scan is read again next time:
#: a file added within the file system's timestamp granularity of the scan
#: may leave the mtime as it was.
_RACY_NS = 2_000_000_000


class _PathEntry:
    """One path of a root, answering as the :class:`os.DirEntry` of a listing would."""

    def __init__(self, path: str) -> None:
        self.path, self.name = path, os.path.basename(path)
        self._stat = os.lstat(path)

    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self._stat.st_mode)

    def is_dir(self, *, follow_symlinks: bool = False) -> bool:
        return stat.S_ISDIR(self._stat.st_mode)

    def is_file(self, *, follow_symlinks: bool = False) -> bool:
        return stat.S_ISREG(self._stat.st_mode)

    def stat(self, *, follow_symlinks: bool = False) -> os.stat_result:
        return self._stat


_Entry = os.DirEntry[str] | _PathEntry
Refuse = Callable[[DshError], None]


def _raise(error: DshError) -> None:
    raise error


class SessionRoot:
    """The session logs of a sessions root in dsh's layout, kept from one
    look to the next.

    :meth:`scan` reads the whole root; :meth:`update` only the paths given
    as changed (a project, a session folder, a file in one), so a follower
    told what changed (inotify) does work in proportion to it. ``watch``
    is called with each folder before it is read, so a change made while
    it is read is told too. A session folder whose mtime did not change
    since it was read is not read again: what it held stands (files added,
    removed or renamed in a folder change its mtime).
    """

    def __init__(self, root: str | os.PathLike[str], watch: Callable[[str], None] = lambda folder: None) -> None:
        self.root = os.fspath(root)
        self._watch = watch
        self._projects: dict[str, dict[str, Path]] = {}  # project folder -> session folder -> its log
        self._owners: dict[str, str] = {}  # session folder name -> where it was found first
        self._folders: dict[str, tuple[int, FolderLog]] = {}  # what each session folder held, by its mtime

    def __len__(self) -> int:
        return sum(len(sessions) for sessions in self._projects.values())

    def __contains__(self, log: Path) -> bool:
        return self._projects.get(str(log.parent.parent), {}).get(str(log.parent)) == log

    def scan(self, refuse: Refuse = _raise) -> list[Path]:
        """Read the whole root; every session log, sorted. An entry
        outside the layout is passed to ``refuse`` (by default, raised)."""
        self._projects.clear()
        self._owners.clear()
        racy = time.time_ns() - _RACY_NS
        self._watch(self.root)
        for entry in _sorted_entries(self.root):
            self._project(entry, refuse, racy)
        return sorted(log for sessions in self._projects.values() for log in sessions.values())

    def update(self, changed: Iterable[str], refuse: Refuse = _raise) -> list[Path]:
        """Look again at paths of the root that changed; the logs of the
        session folders they touch, sorted."""
        racy = time.time_ns() - _RACY_NS
        touched: list[Path] = []
        for path in sorted(set(changed)):  # a folder before what is in it
            parts = os.path.relpath(path, self.root).split(os.sep)
            if parts[0] in (".", ".."):
                continue  # the root itself
            if len(parts) == 1:  # a project: read again whole
                self._forget_project(path)
                sessions = self._project(self._entry(path), refuse, racy)
                touched += sessions.values() if sessions else ()
                continue
            project = os.path.join(self.root, parts[0])
            folder = os.path.join(project, parts[1])
            sessions = self._projects.get(project)
            if sessions is None:
                continue  # not a project folder
            self._forget_session(sessions, folder)
            log = self._session(sessions, self._entry(folder), refuse, racy)
            if log is not None:
                touched.append(log)
        return sorted(set(touched))

    @staticmethod
    def _entry(path: str) -> _Entry | None:
        try:
            return _PathEntry(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _forget_project(self, project: str) -> None:
        for folder in self._projects.pop(project, {}):
            if self._owners.get(os.path.basename(folder)) == folder:
                del self._owners[os.path.basename(folder)]

    def _forget_session(self, sessions: dict[str, Path], folder: str) -> None:
        if sessions.pop(folder, None) is not None and self._owners.get(os.path.basename(folder)) == folder:
            del self._owners[os.path.basename(folder)]

    def _linked(self, entry: _Entry, refuse: Refuse) -> bool:
        if entry.is_symlink():
            refuse(CorruptionError(f"{entry.path}: a symbolic link; links in a sessions root are not followed"))
            return True
        return False

    def _project(self, entry: _Entry | None, refuse: Refuse, racy: int) -> dict[str, Path] | None:
        """Read one entry of the root: a project folder, else refused if it is a log."""
        if entry is None or self._linked(entry, refuse):
            return None
        if not entry.is_dir(follow_symlinks=False):
            if _looks_like_log(entry.name):
                refuse(LayoutError(f"{entry.path}: a session log directly in the sessions root; {LAYOUT}"))
            return None
        self._watch(entry.path)
        sessions = self._projects[entry.path] = {}
        for child in _sorted_entries(entry.path):
            self._session(sessions, child, refuse, racy)
        return sessions

    def _session(self, sessions: dict[str, Path], entry: _Entry | None, refuse: Refuse, racy: int) -> Path | None:
        """Read one entry of a project: a session folder, else refused if it is a log."""
        if entry is None or self._linked(entry, refuse):
            return None
        if entry.is_file(follow_symlinks=False) and _looks_like_log(entry.name):
            what = ("a session folder directly in the sessions root (its project folder is missing)"
                    if is_log_name(entry.name) else "a flat session file (dsh's obsolete layout)")
            refuse(LayoutError(f"{entry.path}: {what}; {LAYOUT}"))
        if not entry.is_dir(follow_symlinks=False):
            return None
        self._watch(entry.path)
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime_ns
        except FileNotFoundError:  # removed since it was listed
            return None
        known = self._folders.get(entry.path)
        log = known[1] if known is not None and known[0] == mtime else _session_log(entry.path)
        if mtime < racy:
            self._folders[entry.path] = (mtime, log)
        if isinstance(log, DshError):
            refuse(log)
        if not isinstance(log, Path):
            return None
        owner = self._owners.setdefault(entry.name, entry.path)
        if owner != entry.path:
            refuse(CorruptionError(f"{entry.path}: session {entry.name!r} is also at {owner}; a root holds one "
                                   "log per session id"))
            return None
        sessions[entry.path] = log
        return log


def find_session_files(root: str | os.PathLike[str], refuse: Refuse | None = None) -> list[Path]:
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
    and ``refuse`` gets the error. A follower keeps a :class:`SessionRoot`
    instead, to look again at what changed only.
    """
    return SessionRoot(root).scan(refuse or _raise)


def _session_log(folder: str) -> FolderLog:
    """The log of one session folder (its newest generation), the refusal
    of what it holds, or None."""
    generations: dict[int, list[os.DirEntry[str]]] = {}
    for child in _sorted_entries(folder):
        named = _LOG_NAME.fullmatch(child.name)
        if named:
            generations.setdefault(int(named[1] or 0), []).append(child)
    files = generations.get(max(generations, default=0), [])
    odd = [child for child in files if not child.is_file(follow_symlinks=False)]
    if odd:
        return CorruptionError(f"{odd[0].path}: not a regular file")
    if len(files) == 2:
        return CorruptionError(f"{folder}: holds both {files[0].name} and {files[1].name}")
    return Path(files[0].path) if files else None
