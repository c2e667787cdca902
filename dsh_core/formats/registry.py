"""Every session format this build reads, by header version: :data:`FORMATS`.

A session's header line says its format; :func:`open_fold` reads it and
opens that format's fold (:class:`~dsh_core.formats.contract.SessionFold`),
:func:`read_header` checks it as that format's reader does, and
:func:`format_of` gives a fold's :class:`~dsh_core.formats.contract.Format`
(its wire, whether dsh writes it today, its snapshots). A header of a
version no entry has is read by v0's reader, which refuses it as dsh 0.1
did (:func:`~dsh_core.session_header.version_refusal`). Nothing outside
this module branches on a format's version or a fold's class.

The next format: its package under ``dsh_core/formats`` and one line
here (docs/contributing.md, "Adding a session format").
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptionError, DecodeError, FormatUnsupportedError
from ..jsonvalue import decode_json
from ..session_header import SessionHeader
from . import v0, v3, v4
from .contract import FoldObserver, FoldOptions, Format, SessionFold
from .snapshots import TaggedSnapshots
from .v3.pickled import read_pickled

__all__ = ["FALLBACK", "FORMATS", "TAGGED_SNAPSHOTS", "V4_SNAPSHOT_MAGIC", "check_generation", "format_for", "format_of",
           "header_version", "open_fold", "read_header"]

#: The tagged snapshot layout's first line (its number after ``layout``).
V4_SNAPSHOT_MAGIC = b"dsh-pipeline v4 fold snapshot, layout %d\n"
#: The formats whose fold saves a tagged Struct, in the layout they share.
_TAGGED = (v3, v4)
#: Layout 3 (layouts 1 and 2, which earlier builds pickled, are read once).
TAGGED_SNAPSHOTS = TaggedSnapshots(V4_SNAPSHOT_MAGIC, 3, tuple(package.STATE for package in _TAGGED),
                                   {1: read_pickled, 2: read_pickled})

#: The formats, by header version.
FORMATS: dict[int, Format] = {record.version: record for record in (
    v0.format_record(v0.V0Snapshots()),
    *(package.format_record(TAGGED_SNAPSHOTS) for package in _TAGGED),
)}
#: What reads a header of a version no entry has (and refuses it), and a snapshot no layout claims.
FALLBACK = FORMATS[0]


def format_for(version: Any) -> Format:
    """The format of a header ``version`` (v0's, which refuses it, for one this build does not read)."""
    return FORMATS.get(version, FALLBACK) if type(version) is int else FALLBACK


def format_of(fold: SessionFold) -> Format:
    """The format of ``fold``."""
    return FORMATS[fold.format_version]


def _decode_header(line: bytes, where: str) -> Any:
    try:
        return decode_json(line)
    except DecodeError as exc:
        raise CorruptionError(f"{where}: corrupt session log: header line is not valid JSON ({exc.message})") from None


def header_version(parsed: Any) -> Any:
    """The ``version`` of a decoded header line (``None`` when it has none)."""
    return parsed.get("version") if isinstance(parsed, dict) else None


def read_header(line: bytes, where: str, generation: int | None = None) -> SessionHeader:
    """A header line of any format this build reads, checked as its format's
    reader checks it, after the ``generation`` a file's name gives (raises
    :class:`CorruptionError` or :class:`FormatUnsupportedError` naming
    ``where``)."""
    parsed = _decode_header(line, where)
    version = header_version(parsed)
    check_generation(where, generation, version)
    return format_for(version).read_header(parsed, where)


def check_generation(where: str, generation: int | None, version: Any) -> None:
    """A file named for a generation (``session.v4.jsonl``) holds a header of
    that version; raises :class:`FormatUnsupportedError` otherwise."""
    if generation is not None and type(version) is int and version != generation:
        raise FormatUnsupportedError(f"{where}: session generation filename identifies v{generation}, but its "
                                     f"header identifies v{version}")


def open_fold(line: bytes, where: str, observer: FoldObserver | None = None, *, generation: int | None = None,
              folder: str | None = None, keep_migrated: bool = False,
              children: list[dict[str, Any]] | None = None) -> SessionFold:
    """The fold of the session whose header is ``line``, having read it.
    A file's name gives its ``generation`` (the header's version must be
    it) and its ``folder`` (a v3/v4 header's id must be the folder's);
    with ``keep_migrated`` a migrating fold keeps its events as migrated,
    catalogued with the subagent ``children`` dsh's migration lists."""
    parsed = _decode_header(line, where)
    version = header_version(parsed)
    check_generation(where, generation, version)
    options = FoldOptions(folder=folder, keep_migrated=keep_migrated, children=children or [])
    return format_for(version).open(parsed, line, where, observer, options)
