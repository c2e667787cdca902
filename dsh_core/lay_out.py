"""Laying session logs out in dsh's directory layout: a log kept anywhere,
under any name, copied to where dsh keeps it (``ship --layout-from``)."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from .errors import LayoutError
from .formats.registry import read_header
from .storage.layout import compression_of, log_path
from .storage.reader import header_line_of
from .storage.writer import create_file

__all__ = ["lay_out"]


def lay_out(source: Path, root: Path) -> Path | None:
    """Copy the session log ``source`` (raw, or zstd frames when its name
    ends in ``.zstd``) to its place under ``root`` as its header says:
    project folder from ``cwd``, session folder from ``id``, file name from
    ``version``. Returns that path, or None when the same bytes are there
    already. Another file in that place is a :class:`LayoutError`: nothing
    is overwritten. The copy is published whole (written, fsynced, linked)."""
    header = read_header(header_line_of(source), str(source))
    target = log_path(root, header.cwd if isinstance(header.cwd, str) else None, header.id,
                      compression_of(source), header.version)
    if target.exists() and filecmp.cmp(source, target, shallow=False):
        return None
    try:
        with open(source, "rb") as reading:
            create_file(target, lambda writing: shutil.copyfileobj(reading, writing))
    except FileExistsError:
        raise LayoutError(f"{source}: not laid out: {target} holds another log of session {header.id!r}") from None
    return target
