"""Crash repair (docs/formats/v0.md §8.8): the synthetic events that close an open tail turn.

:class:`OpenTurnTracker` follows a log one event at a time (after legacy
upgrades) and knows, at any point, which closers a log ending there needs:
an error result per unresolved tool call, then ``step/end`` if a step is
open, then ``turn/end`` with reason ``interrupted``, all at the last event's
time. The texts and ids are dsh's, byte for byte.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED", "OUTCOME_UNKNOWN_TEXT", "NOT_STARTED_TEXT",
           "OpenTurnSnapshot", "OpenTurnTracker", "interrupted_turn_closers"]

TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
TOOL_NOT_STARTED = "TOOL_NOT_STARTED"

OUTCOME_UNKNOWN_TEXT = (
    "The tool call was interrupted after it was recorded, but no result was durably recorded. "
    "Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the "
    "operation is read-only or idempotent; if it may have side effects, first verify external "
    "state or ask the user. Do not retry blindly."
)
NOT_STARTED_TEXT = (
    "The tool call was interrupted before the Harness recorded it as started. "
    "Retry it if it is still needed."
)


class OpenTurnSnapshot(msgspec.Struct, frozen=True):
    """What :meth:`OpenTurnTracker.snapshot` saves. Values are as the log
    gave them (in a log refused later they may be any JSON value)."""

    open_turn: Any
    open_step: Any
    last_seq: Any
    last_time: Any
    #: ``(callId, step, tool/call seq or None)`` of each unresolved call, in order
    pending: list[tuple[Any, Any, Any]]


class OpenTurnTracker:
    """Streaming state for :func:`interrupted_turn_closers`."""

    __slots__ = ("open_turn", "open_step", "pending", "last_seq", "last_time")

    def __init__(self) -> None:
        self.open_turn: Any = None
        self.open_step: Any = None
        # callId -> [step of the requesting assistant/message, seq of its tool/call or None]
        self.pending: dict[Any, list[Any]] = {}
        self.last_seq: int | None = None
        self.last_time: Any = None

    def observe(self, event_type: str, seq: int, time: Any, data: Any) -> None:
        self.last_seq, self.last_time = seq, time
        if event_type == "turn/start":
            self.open_turn, self.open_step = data["turn"], None
            self.pending.clear()
        elif event_type == "turn/end":
            self.open_turn = self.open_step = None
            self.pending.clear()
        elif event_type == "step/start":
            self.open_step = data["step"]
        elif event_type == "step/end":
            self.pending.clear()
            self.open_step = None
        elif event_type == "assistant/message":
            for block in data["message"]["content"]:
                if isinstance(block, dict) and block.get("type") == "tool-call":
                    # Re-requesting a pending id keeps its place but forgets its call.
                    self.pending[block.get("id")] = [data["step"], None]
        elif event_type == "tool/call":
            entry = self.pending.get(data["callId"])
            if entry is not None:
                entry[1] = seq
        elif event_type == "tool/result":
            self.pending.pop(data["message"]["source"]["callId"], None)

    def snapshot(self) -> OpenTurnSnapshot:
        """The tracker's state, detached from it."""
        pending = [(call_id, step, call_seq) for call_id, (step, call_seq) in self.pending.items()]
        return OpenTurnSnapshot(self.open_turn, self.open_step, self.last_seq, self.last_time, pending)

    @classmethod
    def restore(cls, saved: OpenTurnSnapshot) -> "OpenTurnTracker":
        """The tracker :meth:`snapshot` saved."""
        tracker = cls()
        tracker.open_turn, tracker.open_step = saved.open_turn, saved.open_step
        tracker.last_seq, tracker.last_time = saved.last_seq, saved.last_time
        tracker.pending = {call_id: [step, call_seq] for call_id, step, call_seq in saved.pending}
        return tracker

    def observe_passive(self, last_seq: int, last_time: int) -> None:
        """Events repair ignores: only the last seq and time move."""
        self.last_seq, self.last_time = last_seq, last_time

    def closers(self) -> list[dict[str, Any]]:
        """The closer events a log ending here needs (empty when balanced)."""
        if self.open_turn is None or self.last_seq is None:
            return []
        seq = self.last_seq + 1
        time = self.last_time
        out: list[dict[str, Any]] = []
        for call_id, (step, call_seq) in self.pending.items():
            started = call_seq is not None
            message = {
                "id": f"interrupted-tool-result-{call_id}-{seq}",
                "role": "user",
                "source": {"kind": "tool", "callId": call_id},
                "content": [{"type": "tool-result", "toolCallId": call_id, "isError": True,
                             "content": [{"type": "text", "text": OUTCOME_UNKNOWN_TEXT if started else NOT_STARTED_TEXT}]}],
            }
            error = ({"name": "ToolOutcomeUnknownError", "code": TOOL_OUTCOME_UNKNOWN} if started
                     else {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED})
            closer: dict[str, Any] = {"type": "tool/result", "seq": seq, "time": time,
                                      "data": {"turn": self.open_turn, "step": step, "message": message, "error": error},
                                      "surfaceOp": "append"}
            if started:
                closer["sourceEventSeqs"] = [call_seq]
            out.append(closer)
            seq += 1
        if self.open_step is not None:
            out.append({"type": "step/end", "seq": seq, "time": time,
                        "data": {"turn": self.open_turn, "step": self.open_step}})
            seq += 1
        out.append({"type": "turn/end", "seq": seq, "time": time,
                    "data": {"turn": self.open_turn, "reason": {"kind": "interrupted"}}})
        return out


def interrupted_turn_closers(events: list[Any]) -> list[dict[str, Any]]:
    """Closers for a whole list of :class:`~dsh_core.events.Event`."""
    tracker = OpenTurnTracker()
    for event in events:
        tracker.observe(event.type, event.seq, event.time, event.data)
    return tracker.closers()
