"""``migrate``: a v0 or v3 log rewritten as the v4 log dsh 0.2.1 would make of it.

dsh 0.2.1 migrates an older log on its first write open: it publishes a new
``session.v4.jsonl.zstd`` beside the untouched source, a header frame and
one frame with every event. Its packaged 0.2.1rc2 binary cannot (its
migration worker is missing from the executable), so a session a 0.1.x
agent wrote cannot be continued by a 0.2.1rc2 agent. This writes that file
from the log migrated as dsh migrates it (v0: :mod:`.chain`; v3:
:class:`~dsh_core.formats.v3.fold.V3Fold`), refusing a log it would refuse, with the
``subagent/catalog`` entries dsh adds for the session's children in the
same sessions root; it never replaces a file: the source stays, and an
existing v4 file is left alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import DshError, FormatUnsupportedError, PipelineError
from ..jsonvalue import decode_json, encode_json
from ..storage.framing import compress_frame
from ..storage.layout import encode_segment, find_session_files, generation_of
from ..formats import FORMATS
from ..loader import load_session, read_events
from ..storage.reader import header_line_of
from ..formats.v4.rows import encode_seq_ranges
from .chain import MigratedLog, migrate_v0_log

__all__ = ["V4_NAME", "children_of", "migrate", "migrated_log", "v4_file"]

#: The file dsh 0.2.1 writes a migrated log to, beside its source.
V4_NAME = "session.v4.jsonl.zstd"

def _line(event: dict[str, Any]) -> bytes:
    """One event as dsh writes a migrated one: its own key order, ``sourceEventSeqs`` range-encoded in place."""
    if "sourceEventSeqs" in event:
        event = {**event, "sourceEventSeqs": encode_seq_ranges(list(event["sourceEventSeqs"]))}
    return encode_json(event)


def migrated_log(source: str | os.PathLike[str], candidates: Iterable[Path] | None = None) -> MigratedLog:
    """The v4 header and events dsh 0.2.1 makes of the v0 or v3 log ``source``
    (raises :class:`DshError` where dsh refuses to migrate it). Its subagent
    children are looked for among ``candidates`` (session files), by default
    every session file of its sessions root, as dsh looks."""
    source = Path(source)
    generation = generation_of(source)
    if generation in FORMATS and FORMATS[generation].current:
        raise FormatUnsupportedError(f"{source}: a v4 log is current already; nothing to migrate")
    edge = _EDGES.get(generation) if generation is not None else None
    if edge is None:
        raise FormatUnsupportedError(f"{source}: migrate takes a v0 or v3 log in dsh's layout (session.jsonl[.zstd] "
                                     "or session.v3.jsonl[.zstd])")
    header = decode_json(header_line_of(source))
    session_id = header.get("id") if isinstance(header, dict) else None
    children: list[dict[str, Any]] = []
    if type(session_id) is str and source.parent.name == encode_segment(session_id):  # in dsh's layout
        if candidates is None:  # <root>/<project>/<session>/<file>: dsh looks for the session's children in its root
            candidates = find_session_files(source.parent.parent.parent, refuse=lambda error: None)
        children = children_of(candidates, session_id, _read_child)
    return edge(source, children)


def _migrate_loaded(source: Path, children: list[dict[str, Any]]) -> MigratedLog:
    """A log whose fold migrates it as it reads (v3), with its ``children`` catalogued."""
    result = load_session(source, keep_migrated=True, children=children)
    if not result.accepted:
        assert result.error is not None
        raise result.error
    if result.migrated_events is None or result.header is None:
        raise FormatUnsupportedError(f"{source}: the file does not hold a v3 log")
    return MigratedLog(result.header, result.migrated_events)


#: dsh's migration to the current format, by the generation a log's file name gives.
_EDGES: dict[int, Callable[[Path, list[dict[str, Any]]], MigratedLog]] = {0: migrate_v0_log, 3: _migrate_loaded}


def _read_child(path: Path) -> tuple[list[dict[str, Any]], int]:
    """A child's events as its own migration (or v4 read) gives them, and its
    inherited cut; its own children are not looked at."""
    generation = generation_of(path)
    edge = _EDGES.get(generation) if generation is not None else None
    if edge is not None:
        migrated = edge(path, [])
        events, seeded = migrated.events, migrated.header.isSeeded
    else:
        result = load_session(path)
        if not result.accepted or result.header is None:
            assert result.error is not None
            raise result.error
        events, seeded = read_events(path)[1], result.header.isSeeded
    marks = [event["seq"] for event in events if event["type"] == "session/end-seed"
             and isinstance(event["data"], dict) and event["data"].get("inherited") is True]
    return events, (marks[-1] if seeded and marks else 0)


def migrate(source: str | os.PathLike[str]) -> Path:
    """Write ``session.v4.jsonl.zstd`` beside the v0 or v3 log ``source`` (a
    session folder: its newest generation, as dsh resolves it); returns its path."""
    source = Path(source)
    if source.is_dir():
        logs = [log for log in source.iterdir() if generation_of(log) is not None]
        source = max(logs, key=lambda log: generation_of(log) or 0) if logs else source / "session.jsonl.zstd"
    data = v4_file(migrated_log(source))  # a refusal raises before anything is written
    target = source.parent / V4_NAME
    staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        with open(staged, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.link(staged, target)  # publish without replacing what is there
    except FileExistsError:
        raise PipelineError(f"{target}: already exists; migrate never replaces a log") from None
    finally:
        staged.unlink(missing_ok=True)
    return target


def v4_file(migrated: MigratedLog) -> bytes:
    """The bytes of the v4 file dsh writes for a migrated log: a header
    frame, then one frame with every event."""
    header = migrated.header.to_dict() | {"version": 4}
    return (compress_frame(encode_json({"type": "session", **header}) + b"\n")
            + compress_frame(b"".join(_line(event) + b"\n" for event in migrated.events)))


#: A child's events as its migration reads them, with its inherited cut; raises DshError.
ReadChild = Callable[[Path], "tuple[list[dict[str, Any]], int]"]


def children_of(candidates: Iterable[Path], parent_id: str, read_child: ReadChild) -> list[dict[str, Any]]:
    """The child facts of ``parent_id`` among the session files ``candidates``: ``{childId, childCreatedAt,
    descriptors}`` (``descriptors`` ``None`` when the child cannot be read), ordered by path."""
    out = []
    for path in sorted(candidates):
        header = _header_of(path)
        if header is None or header.get("origin") != "subagent" or header.get("parentSession") != parent_id:
            continue
        try:
            events, cut = read_child(path)
            descriptors: list[Any] | None = [event["data"] for event in events
                                             if event["type"] == "subagent/descriptor" and event["seq"] >= cut]
        except DshError:
            descriptors = None
        out.append({"childId": header.get("id"), "childCreatedAt": header.get("createdAt"),
                    "descriptors": descriptors})
    return out


def _header_of(path: Path) -> dict[str, Any] | None:
    try:
        header = decode_json(header_line_of(path))
    except (DshError, OSError):
        return None
    return header if isinstance(header, dict) else None


