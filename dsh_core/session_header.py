"""The session header (docs/formats/v0.md §8.2): the first line of every stored log."""

from __future__ import annotations

import os
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from .errors import CorruptionError, FormatUnsupportedError, SessionHeaderError
from .jsonvalue import MAX_SAFE_INTEGER, encode_json

__all__ = ["FORMAT_VERSION", "SessionHeader", "parse_header_line", "version_refusal"]

#: The session format version of dsh 0.1.0–0.1.2 (this module's header);
#: v3 and v4 headers are read by :mod:`dsh_core.formats.v4.header`.
FORMAT_VERSION = 0
#: The newest format version this build reads.
NEWEST_VERSION = 4


class SessionHeader(msgspec.Struct, frozen=True, omit_defaults=True):
    """Creation metadata of a session; field order is dsh's write order."""

    id: str
    createdAt: int
    version: int = FORMAT_VERSION
    cwd: str | UnsetType = UNSET
    parentSession: str | UnsetType = UNSET
    seedLength: int | UnsetType = UNSET
    origin: str | UnsetType = UNSET
    delegationDepth: int | UnsetType = UNSET
    agentPreset: str | UnsetType = UNSET
    #: v3 and later: whether the log starts with events inherited from a parent (a fork)
    isSeeded: bool | UnsetType = UNSET

    def to_dict(self) -> dict[str, Any]:
        """The header as loaded: ``version, id, createdAt``, the optional
        fields present, and ``delegationDepth`` (0 when never set); v3 and
        later in their own order, with ``isSeeded``."""
        if self.version > 0:
            fields: dict[str, Any] = {"version": self.version, "id": self.id, "createdAt": self.createdAt}
            fields.update({key: getattr(self, key) for key in ("cwd", "parentSession") if getattr(self, key) is not UNSET})
            fields["isSeeded"] = self.isSeeded
            if self.origin is not UNSET:
                fields["origin"] = self.origin
            fields["delegationDepth"] = self.delegationDepth
            if self.agentPreset is not UNSET:
                fields["agentPreset"] = self.agentPreset
            return fields
        out: dict[str, Any] = {"version": self.version, "id": self.id, "createdAt": self.createdAt}
        for key in ("cwd", "parentSession", "seedLength", "origin"):
            value = getattr(self, key)
            if value is not UNSET:
                out[key] = value
        out["delegationDepth"] = 0 if self.delegationDepth is UNSET else self.delegationDepth
        if self.agentPreset is not UNSET:
            out["agentPreset"] = self.agentPreset
        return out

    def to_line(self) -> bytes:
        """The header line dsh writes (without the newline)."""
        return encode_json({"type": "session", **self.to_dict()})

    def validate(self) -> None:
        """Restore-time checks of dsh's session (raises :class:`SessionHeaderError`)."""
        where = f"session {self.id!r} header"
        if self.version != FORMAT_VERSION:
            raise SessionHeaderError(f"{where}: version must be {FORMAT_VERSION}, got {self.version}")
        if self.cwd is not UNSET and (type(self.cwd) is not str or not os.path.isabs(self.cwd)):
            raise SessionHeaderError(f"{where}: cwd must be an absolute path, got {self.cwd!r}")
        if self.parentSession is not UNSET and type(self.parentSession) is not str:
            raise SessionHeaderError(f"{where}: parentSession must be a string")
        if self.seedLength is not UNSET and not _safe_nonneg(self.seedLength):
            raise SessionHeaderError(f"{where}: seedLength must be a non-negative safe integer")
        if self.origin is not UNSET and self.origin != "subagent":
            raise SessionHeaderError(f'{where}: origin must be "subagent"')


def version_refusal(session_id: Any, version: Any, where: str) -> FormatUnsupportedError:
    """The refusal for a log in a format version this build has no reader
    for (docs/formats/v0.md §8.9); names the file."""
    sid = session_id if isinstance(session_id, str) else encode_json(session_id).decode()
    shown = int(version) if isinstance(version, float) and version.is_integer() else version
    if version > NEWEST_VERSION:
        reason = (f"session {sid!r} uses log format v{shown}, but this build reads only v0, v3 and v4: "
                  "the log was written by a newer harness; upgrade to open it")
    else:
        reason = (f"session {sid!r} uses log format v{shown}, which no published dsh release writes; "
                  "this build reads v0, v3 and v4")
    return FormatUnsupportedError(f"{reason} (raw log: {where})")


def _safe_nonneg(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def parse_header_line(parsed: Any, where: str) -> SessionHeader:
    """Check a decoded first line: version first (v0 §8.9), then the header
    rules of v0 §8.2. ``where`` names the file for error messages."""
    if isinstance(parsed, dict):
        version = parsed.get("version")
        if type(version) in (int, float) and version != FORMAT_VERSION:
            raise version_refusal(parsed.get("id"), version, where)
    if not isinstance(parsed, dict) or parsed.get("type") != "session":
        raise CorruptionError(f"{where}: line 1 is not a session header")
    problems = []
    if type(parsed.get("version")) not in (int, float):
        problems.append("version must be a number")
    if type(parsed.get("id")) is not str:
        problems.append("id must be a string")
    if not _safe_nonneg(parsed.get("createdAt")):
        problems.append("createdAt must be a non-negative safe integer")
    if not _safe_nonneg(parsed.get("delegationDepth")):
        problems.append("delegationDepth is required and must be a non-negative safe integer")
    if "origin" in parsed and parsed["origin"] != "subagent":
        problems.append('origin may only be "subagent"')
    if "agentPreset" in parsed and type(parsed["agentPreset"]) is not str:
        problems.append("agentPreset must be a string")
    if "sandboxMode" in parsed or "approvalPolicy" in parsed:
        problems.append("retired policy fields sandboxMode/approvalPolicy are present")
    if problems:
        raise CorruptionError(f"{where}: line 1 is not a valid session header: {'; '.join(problems)}")
    # cwd, parentSession and seedLength are checked when the session is
    # restored (SessionHeader.validate), after the reader's own checks.
    return SessionHeader(
        id=parsed["id"], createdAt=parsed["createdAt"], version=parsed["version"],
        cwd=parsed.get("cwd", UNSET), parentSession=parsed.get("parentSession", UNSET),
        seedLength=parsed.get("seedLength", UNSET), origin=parsed.get("origin", UNSET),
        delegationDepth=parsed["delegationDepth"], agentPreset=parsed.get("agentPreset", UNSET),
    )
