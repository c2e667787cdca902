"""The session header of v3 and v4 logs, read as dsh 0.2.1 reads it.

The first line holds exactly ``type, version, id, createdAt, isSeeded,
delegationDepth`` plus the optional ``cwd, parentSession, origin,
agentPreset`` (dsh's write order: ``type, version, id, createdAt, cwd?,
parentSession?, isSeeded, origin?, delegationDepth, agentPreset?``).
A first line that is not such an object is a corrupt log; a version this
reader has no codec for is refused before the shape is looked at.
"""

from __future__ import annotations

import os
from typing import Any

from ...errors import CorruptionError
from ...jsonvalue import MAX_SAFE_INTEGER
from ...session_header import SessionHeader

__all__ = ["HEADER_KEYS", "parse_header"]

_REQUIRED = ("type", "version", "id", "createdAt", "isSeeded", "delegationDepth")
HEADER_KEYS = frozenset(_REQUIRED + ("cwd", "parentSession", "origin", "agentPreset"))


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _problem(parsed: dict[str, Any]) -> str | None:
    """What keeps ``parsed`` from being a v3/v4 header (dsh's ``isHeaderLine``), or ``None``."""
    missing = next((key for key in _REQUIRED if key not in parsed), None)
    if missing is not None:
        return f"it lacks {missing}"
    extra = next((key for key in parsed if key not in HEADER_KEYS), None)
    if extra is not None:
        return f"it has the unexpected field {extra}"
    if parsed["type"] != "session":
        return 'its type is not "session"'
    if type(parsed["id"]) is not str:
        return "id is not a string"
    for key in ("createdAt", "delegationDepth"):
        if not _count(parsed[key]):
            return f"{key} is not a non-negative safe integer"
    if type(parsed["isSeeded"]) is not bool:
        return "isSeeded is not a boolean"
    cwd = parsed.get("cwd")
    if "cwd" in parsed and (type(cwd) is not str or not os.path.isabs(cwd)):
        return "cwd is not an absolute path"
    for key in ("parentSession", "agentPreset"):
        if key in parsed and type(parsed[key]) is not str:
            return f"{key} is not a string"
    if "origin" in parsed and parsed["origin"] != "subagent":
        return 'origin is not "subagent"'
    return None


def parse_header(parsed: Any, where: str) -> SessionHeader:
    """A decoded first line (its version already checked) as a header."""
    if not isinstance(parsed, dict):
        raise CorruptionError(f"{where}: corrupt session log: first line is not a JSON object")
    if "sandboxMode" in parsed or "approvalPolicy" in parsed:
        raise CorruptionError(f"{where}: session header uses retired policy baseline fields")
    problem = _problem(parsed)
    if problem is not None:
        raise CorruptionError(f"{where}: corrupt session log: first line is not a session header ({problem})")
    optional = {key: parsed[key] for key in ("cwd", "parentSession", "origin", "agentPreset") if key in parsed}
    return SessionHeader(id=parsed["id"], createdAt=parsed["createdAt"], version=parsed["version"],
                         isSeeded=parsed["isSeeded"], delegationDepth=parsed["delegationDepth"], **optional)
