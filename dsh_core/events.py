"""Event envelope and vocabulary of the dsh session log (docs/formats/v0.md §1–§2).

An :class:`Event` is a frozen msgspec Struct over the exact envelope keys.
``data`` holds the payload as the JSON value it was written with (frozen), so
fields this build does not model — extra message-source fields, plugin
payloads, unknown event types — are kept verbatim and re-encode to the same
JSON value.

Evolution rules: a new payload field gets a default; an event type tag, once
written to a log, is forever; the on-disk format version only changes through
a named upgrade step (see :mod:`dsh_core.formats.v0.legacy`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from .jsonvalue import encode_json, freeze

__all__ = [
    "Event",
    "is_row",
    "SURFACE_TYPES",
    "KNOWN_TYPES",
    "RETIRED_TYPES",
    "ROW_TAGS",
    "event_from_json",
]

#: Event types whose events produce model-visible messages (docs/formats/v0.md §4).
SURFACE_TYPES = frozenset({"user/message", "assistant/message", "tool/result"})

#: The vocabulary of dsh 0.1.1-rc.2: 13 core types plus the plugin types (v0 §2.5).
KNOWN_TYPES = frozenset({
    "agent-preset/selected", "agent/inbox/spliced", "approval/asked",
    "approval/decided", "approval/policy", "assistant/chunk", "assistant/message",
    "command/done", "command/run", "compaction/end", "compaction/prune",
    "compaction/start", "compaction/summary", "feedback/record", "goal/change",
    "hook/invoked", "hook/result", "llm/retry", "llm/retry-started",
    "permission/preset", "plan/mode", "request/context", "request/header",
    "sandbox/mode", "schedule/change", "session/end-seed", "session/title",
    "session/title-llm-request", "step/end", "step/start", "subagent/descriptor",
    "team/member", "team/message/delivered", "team/message/queued", "team/task",
    "todo/write", "tool-workflow/agent-end", "tool-workflow/agent-start",
    "tool-workflow/run-end", "tool-workflow/run-start", "tool/call",
    "tool/code-dispatch", "tool/code-dispatch-start", "tool/result", "turn/end",
    "turn/start", "user/message", "web/deepseek-search-llm-request",
})

#: Types rejected on append, seed and load (docs/formats/v0.md §8.10).
RETIRED_TYPES = frozenset({"request/header-delta", "mode/set"})

#: Storage-only tags of packed chunk rows (docs/formats/v0.md §8.3); never session events.
ROW_TAGS = frozenset({"text-chunks", "reasoning-chunks", "tool-call-chunks"})


def is_row(value: Any) -> bool:
    """Whether a decoded record is a packed chunk row (its ``type`` a row
    tag; a type that is no string at all is not one)."""
    return isinstance(value, dict) and isinstance(tag := value.get("type"), str) and tag in ROW_TAGS


class Event(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One session event: exactly the envelope keys of docs/formats/v0.md §1.

    ``surfaceOp`` is ``"append"`` or a replace object; both surface fields are
    present only on surface types. ``ignorable`` is only ever ``True``.
    """

    type: str
    seq: int
    time: int
    data: Any
    sourceEventSeqs: Any = UNSET
    surfaceOp: Any = UNSET
    ignorable: bool | UnsetType = UNSET

    def to_json(self) -> bytes:
        """The event's JSONL line (without newline) in dsh's writer key order."""
        return encode_json(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "seq": self.seq, "time": self.time, "data": self.data}
        if self.ignorable is not UNSET:
            out["ignorable"] = self.ignorable
        if self.sourceEventSeqs is not UNSET:
            out["sourceEventSeqs"] = self.sourceEventSeqs
        if self.surfaceOp is not UNSET:
            out["surfaceOp"] = self.surfaceOp
        return out


def event_from_json(obj: dict[str, Any]) -> Event:
    """Build a frozen :class:`Event` from a decoded, envelope-checked object."""
    return Event(
        type=obj["type"],
        seq=obj["seq"],
        time=obj["time"],
        data=freeze(obj["data"]),
        sourceEventSeqs=freeze(obj["sourceEventSeqs"]) if "sourceEventSeqs" in obj else UNSET,
        surfaceOp=freeze(obj["surfaceOp"]) if "surfaceOp" in obj else UNSET,
        ignorable=obj["ignorable"] if "ignorable" in obj else UNSET,
    )
