"""Archive files: where a session's file is, and how a run continues one.

``<root>/<project>/<session>/session[.vN].jsonl.zstd`` (named for the
session's format, as dsh names it): the header frame, then one
zstd frame per consumer batch holding the session's records exactly as they
were shipped. The file is the state: its stored length says which seq comes
next.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dsh_core.session_header import SessionHeader
from dsh_core.storage.layout import Compression, compression_of, encode_segment, is_log_name, log_name, project_dir
from dsh_core.storage.reader import load_session_bytes, read_events
from dsh_core.storage.writer import SessionFileWriter

__all__ = ["archive_segment", "existing_file", "new_file", "resume"]

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
            for path in sorted(folder.iterdir()):
                if is_log_name(path.name) and compression_of(path) == compression and path.is_file():
                    return path
    return None


def new_file(root: Path, header: SessionHeader, compression: Compression) -> Path:
    """Where a session first seen with ``header`` is archived."""
    cwd = header.cwd if isinstance(header.cwd, str) else None
    return root / project_dir(cwd) / archive_segment(header.id) / log_name(compression, header.version)


def resume(path: Path, compression: Compression) -> tuple[SessionHeader, int, SessionFileWriter]:
    """The header, next seq and writer of an archive file, cutting off a
    frame torn by a crash (a file left with its header only is started
    again)."""
    data = path.read_bytes()
    result = load_session_bytes(data, str(path), "zstd" if path.name.endswith(".zstd") else "none")
    if result.header is not None and result.committed_bytes < len(data) and result.error is None:
        with open(path, "r+b") as stream:
            stream.truncate(result.committed_bytes)
            os.fsync(stream.fileno())
    header, events = read_events(path)
    if not events:
        path.unlink()
    return header, len(events), SessionFileWriter(path, header, compression, next_seq=len(events))
