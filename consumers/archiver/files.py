"""Archive files: where a session's file is, and how a run continues one.

``<root>/<project>/<session>/session[.vN].jsonl.zstd`` (named for the
session's format, as dsh names it): the header frame, then one
zstd frame per consumer batch holding the session's records exactly as they
were shipped. The file is the state: its stored length says which seq comes
next.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from dsh_core.errors import DshError
from dsh_core.session_header import SessionHeader
from dsh_core.storage.layout import (Compression, compression_of, encode_segment, generation_of, is_log_name, log_name,
                                     project_dir)
from dsh_core.loader import load_session, read_events
from dsh_core.storage.writer import SessionFileWriter, replace_file
from dsh_core.migration.migrate import V4_NAME, migrated_log, v4_file

__all__ = ["archive_segment", "archived_files", "existing_file", "new_file", "remove_session", "resume",
           "write_v4_copy"]

#: The longest folder name file systems take (bytes).
_NAME_BYTES = 255


def archive_segment(session_id: str) -> str:
    """The session's folder name: dsh's escaped segment of its id (which
    never leaves its folder), or, when that is longer than a file name may
    be, its first 190 characters and a digest of the whole id."""
    segment = encode_segment(session_id)
    if len(segment) <= _NAME_BYTES:  # the escaped segment is ASCII
        return segment
    return f"{segment[:190]}~~{hashlib.sha256(session_id.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}"


def existing_file(root: Path, session_id: str, compression: Compression) -> Path | None:
    """The session's archive file if a run before wrote one (its project
    folder and format come from the header, which this run may never see)."""
    segment = archive_segment(session_id)
    for project in root.iterdir():
        folder = project / segment
        if folder.is_dir():
            path = _shipped_file(folder, compression)
            if path is not None:
                return path
    return None


def remove_session(root: Path, session_id: str) -> int:
    """Remove the session's folder from every project folder of ``root``;
    how many there were. The archiver and ``delete-session --archive`` may
    remove one folder at once: what the other removed first is not an error."""
    segment = archive_segment(session_id)
    removed = 0
    for project in root.iterdir():
        folder = project / segment
        if folder.is_dir() and not folder.is_symlink():
            removed += 1
            while folder.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(folder)
    return removed


def archived_files(root: Path, compression: Compression) -> Iterator[Path]:
    """The archive file of every session in ``root``."""
    for project in root.iterdir():
        if project.is_dir():
            for folder in project.iterdir():
                path = _shipped_file(folder, compression) if folder.is_dir() else None
                if path is not None:
                    yield path


def _shipped_file(folder: Path, compression: Compression) -> Path | None:
    """A session folder's archive file: its oldest generation (a v4 file
    beside it is the migrated copy)."""
    logs = [path for path in folder.iterdir()
            if is_log_name(path.name) and compression_of(path) == compression and path.is_file()]
    return min(logs, key=lambda path: generation_of(path) or 0) if logs else None  # a log name has a generation


def new_file(root: Path, header: SessionHeader, compression: Compression) -> Path:
    """Where a session first seen with ``header`` is archived."""
    cwd = header.cwd if isinstance(header.cwd, str) else None
    return root / project_dir(cwd) / archive_segment(header.id) / log_name(compression, header.version)


def resume(path: Path, compression: Compression) -> tuple[SessionHeader, int, SessionFileWriter]:
    """The header, next seq and writer of an archive file, cutting off a
    frame torn by a crash (a file may hold its header alone: a session
    without events, or one whose first batch was cut off)."""
    result = load_session(path)  # read a piece at a time, never the whole file
    if result.header is not None and result.committed_bytes < path.stat().st_size and result.error is None:
        with open(path, "r+b") as stream:
            stream.truncate(result.committed_bytes)
            os.fsync(stream.fileno())
    header, events = read_events(path)
    return header, len(events), SessionFileWriter(path, header, compression, next_seq=len(events), created=True)


def write_v4_copy(path: Path, candidates: Iterable[Path]) -> DshError | None:
    """Write the v4 log dsh 0.2.1 makes of the v0 or v3 archive file
    ``path`` beside it (its subagent children among the archive files
    ``candidates``), replacing the copy an earlier batch made. Where dsh
    refuses to migrate the log, no copy is left and the refusal is returned."""
    target = path.parent / V4_NAME
    try:
        data = v4_file(migrated_log(path, candidates))
    except DshError as error:
        target.unlink(missing_ok=True)
        return error
    replace_file(target, data)
    return None
