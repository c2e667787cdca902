"""A v0 log as dsh 0.2.1 migrates it to v4: v0→v1→v2→v3→v4, then read as v4.

dsh 0.2.1 reads a v0 log only through its migration chain (and writes the
result as a new ``session.v4.jsonl.zstd`` on its first write open). The
rows decode with dsh's v0 codec and its recovery rule (a bad row or a seq
gap drops the rest of the log, unless a later row is a ``turn/end``, which
makes it corruption); then each edge: :mod:`.v0_to_v1` (legacy shapes,
inventory), :mod:`.v1_to_v2` (chunks into streams, seqs renumbered),
:mod:`.v2_to_v3` (system prompt onto the surface) and dsh's v3→v4 edge with
the v4 reading of the result (:class:`~dsh_core.formats.v3.fold.V3Fold`). A refusal is dsh's
``unsupported-format`` (the source is intact, the chain cannot carry it);
corrupt rows are ``corrupt-storage``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import CorruptionError, DecodeError, DshError
from ..jsonvalue import decode_json, encode_json
from ..session_header import SessionHeader
from ..storage.layout import generation_of
from ..storage.reader import read_lines
from .v0_to_v1 import V0ToV1, decode_v0_row, refusal
from .v1_to_v2 import ChunkRun, V1ToV2
from .v2_to_v3 import V2ToV3
from ..formats.v3.fold import V3Fold

__all__ = ["MigratedLog", "migrate_v0_log"]

_HEADER_KEYS = ("version", "id", "createdAt", "cwd", "parentSession", "isSeeded", "origin", "delegationDepth",
                "agentPreset")


class MigratedLog(NamedTuple):
    """The v4 header and events dsh 0.2.1 makes of an older log."""

    header: SessionHeader
    events: list[dict[str, Any]]


class _V0Rows:
    """The line sink: v0 rows decoded, recovered as dsh recovers, through the chain."""

    tolerates_defects = True

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0
        self.rows = 0
        self.issue: DshError | None = None
        self.v3_events: list[dict[str, Any]] = []
        self.header: dict[str, Any] | None = None
        self.cut = 0

    def header_line(self, line: bytes) -> None:
        try:
            parsed = decode_json(line)
        except DecodeError as error:
            raise CorruptionError(f"{self.where}: the session header line is not JSON: {error.message}") from None
        self.header, self.cut = _logical_header(parsed, self.where)
        v2 = {**self.header, "version": 2}
        self.v2_to_v3 = V2ToV3(v2, self.v3_events.append)
        self.v1_to_v2 = V1ToV2(v2, self.cut, self.v2_to_v3.event)
        self.v0_to_v1 = V0ToV1(self.header["id"])

    def event_line(self, line: bytes) -> bool:
        row = self.rows
        self.rows += 1
        try:
            value = decode_json(line)
        except DecodeError:
            self.issue = self.issue or CorruptionError(f"{self.where}: corrupt session log: row {row + 1} is not "
                                                       "valid JSON")
            return False
        turn_end = isinstance(value, dict) and value.get("type") == "turn/end"
        try:
            decoded = decode_v0_row(value, row)
        except DshError as error:
            self.issue = self.issue or CorruptionError(f"{self.where}: stored log is corrupt: {error.message}")
            return False
        if self.issue is not None:
            if turn_end:
                raise self.issue
            return False
        seq = decoded.first_seq if isinstance(decoded, ChunkRun) else decoded.get("seq")
        if seq != self.count:
            self.issue = CorruptionError(f"{self.where}: stored log is corrupt: released Session row {row} has seq "
                                         f"gap (expected {self.count}, got {encode_json(seq).decode()})")
            if turn_end:
                raise self.issue
            return False
        if isinstance(decoded, ChunkRun):
            self.count += decoded.count
            self.v1_to_v2.run(decoded)
        else:
            self.count += 1
            self.v1_to_v2.event(self.v0_to_v1.event(decoded))
        return True


def _logical_header(parsed: Any, where: str) -> tuple[dict[str, Any], int]:
    """dsh's ``decodePhysicalHeader``: the v0 header as its chain carries it, and the inherited cut."""
    if not isinstance(parsed, dict) or parsed.get("type") != "session" or parsed.get("version") != 0:
        raise CorruptionError(f"{where}: stored log is corrupt: expected released v0 physical Session header")
    allowed = {"type", "version", "id", "createdAt", "delegationDepth", "cwd", "parentSession", "seedLength",
               "origin", "agentPreset"}
    unexpected = next((key for key in parsed if key not in allowed), None)
    if unexpected is not None or type(parsed.get("id")) is not str or "delegationDepth" not in parsed:
        raise CorruptionError(f"{where}: stored log is corrupt: released v0 physical header has "
                              f"{'unexpected member ' + unexpected if unexpected else 'no id or delegationDepth'}")
    header = {key: parsed[key] for key in ("version", "id", "createdAt", "cwd", "parentSession") if key in parsed}
    header["isSeeded"] = "seedLength" in parsed
    header.update({key: parsed[key] for key in ("origin", "delegationDepth", "agentPreset") if key in parsed})
    return header, parsed.get("seedLength", 0)


def migrate_v0_log(path: str | os.PathLike[str], children: list[dict[str, Any]]) -> MigratedLog:
    """The v4 log dsh 0.2.1 would write for the v0 log at ``path`` whose
    subagent ``children`` are these (:func:`~.migrate.children_of`); raises
    :class:`DshError` where dsh's migration refuses it."""
    where = str(path)
    rows = _V0Rows(where)
    read_lines(path, rows)
    assert rows.header is not None
    if rows.cut > rows.count:
        raise CorruptionError(f"{where}: stored log is corrupt: Session inheritedEventCount exceeds its event count")
    rows.v1_to_v2.finish()
    v3_header = {**rows.header, "version": 3}
    if v3_header.get("agentPreset") == "code":
        v3_header["agentPreset"] = "ptc"
    folder = Path(where).parent.name if generation_of(where) == 0 else None  # in dsh's layout: its id's folder
    fold = V3Fold(where, folder=folder, keep=True, children=children)
    fold.v4.source_version = 0
    fold.header_value({"type": "session", **{key: v3_header[key] for key in _HEADER_KEYS if key in v3_header}})
    for event in rows.v3_events:
        if not fold.event_line(encode_json(event)):
            raise refusal(f"the migrated event at seq {event['seq']} is not a v3 row dsh reads", version=0)
    fold.finish()  # the children catalogued first, as dsh's v3→v4 edge ends
    assert fold.events is not None, "the fold keeps its events"
    return MigratedLog(fold.header, fold.events)
