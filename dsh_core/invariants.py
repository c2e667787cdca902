"""Streaming structural checker (docs/formats/v0.md §7.1): turn/step numbering, enclosure
of execution events, tool call/result pairing inside a step.

Unlike dsh's optional checker, which raises on the first violation, this one
reports every violation and keeps going, one event at a time, so a consumer
can stream a whole fleet through it. After a violation the state follows
what the event declared (a rejected ``turn/start`` still opens its turn), so
one defect is reported once rather than at every later event.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .jsonvalue import canonical_json

__all__ = ["Violation", "InvariantChecker"]

_TURN_SCOPED = frozenset({"todo/write", "request/header", "request/context"})


def _call_key(call_id: Any) -> Any:
    """A call id as the pending set (and its saved state) holds it: an object
    or array, no id dsh writes but one a log may hold, by its canonical text."""
    if isinstance(call_id, (dict, list, tuple)):
        return "\0json:" + canonical_json(call_id).decode("utf-8", "surrogatepass")
    return call_id


def _object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (its fields all absent)."""
    return value if isinstance(value, dict) else {}


class Violation(NamedTuple):
    """One broken relation: which rule, where, and what was found."""

    rule: str
    seq: int
    turn: Any
    step: Any
    detail: str


class InvariantChecker:
    """Feed events in log order with :meth:`check`; each call returns the
    violations that event causes (usually none)."""

    __slots__ = ("last_seq", "open_turn", "open_step", "next_turn", "next_step", "pending")

    def __init__(self) -> None:
        self.last_seq = -1
        self.open_turn: Any = None
        self.open_step: Any = None
        self.next_turn = 1
        self.next_step = 1
        self.pending: set[Any] = set()

    def to_json(self) -> dict[str, Any]:
        """The checker's state as a JSON value (for :meth:`from_json`)."""
        return {"lastSeq": self.last_seq, "openTurn": self.open_turn, "openStep": self.open_step,
                "nextTurn": self.next_turn, "nextStep": self.next_step, "pending": list(self.pending)}

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> "InvariantChecker":
        checker = cls()
        checker.last_seq, checker.open_turn, checker.open_step = saved["lastSeq"], saved["openTurn"], saved["openStep"]
        checker.next_turn, checker.next_step, checker.pending = saved["nextTurn"], saved["nextStep"], set(saved["pending"])
        return checker

    def check(self, event_type: str, seq: int, data: Any, surface_op: Any = "append") -> list[Violation]:
        found: list[Violation] = []
        d = data if isinstance(data, dict) else {}
        turn, step = d.get("turn"), d.get("step")

        def violation(rule: str, detail: str) -> None:
            found.append(Violation(rule, seq, turn, step, detail))

        if seq <= self.last_seq:
            violation("seq-order", f"seq {seq} does not follow {self.last_seq}")
        self.last_seq = max(seq, self.last_seq)

        if event_type == "turn/start":
            if self.open_turn is not None:
                violation("turn-open", f"turn/start {turn!r} while turn {self.open_turn!r} is open")
            elif turn != self.next_turn:
                violation("turn-number", f"turn/start {turn!r}, expected turn {self.next_turn}")
            self.open_turn, self.open_step, self.next_step = turn, None, 1
            self.pending.clear()
            if type(turn) is int:
                self.next_turn = turn
        elif event_type == "turn/end":
            if turn != self.open_turn or self.open_turn is None:
                violation("turn-end-mismatch", f"turn/end {turn!r} but the open turn is {self.open_turn!r}")
            if self.open_step is not None:
                violation("turn-end-step-open", f"turn/end {turn!r} while step {self.open_step!r} is open")
            if self.open_turn is not None:
                self.next_turn = (self.open_turn + 1) if type(self.open_turn) is int else self.next_turn
            self.open_turn = self.open_step = None
            self.pending.clear()
        elif event_type == "step/start":
            if self.open_turn is None or turn != self.open_turn:
                violation("step-outside-turn", f"step/start {turn!r}/{step!r} but the open turn is {self.open_turn!r}")
            if self.open_step is not None:
                violation("step-open", f"step/start {step!r} while step {self.open_step!r} is open")
            elif step != self.next_step:
                violation("step-number", f"step/start {step!r}, expected step {self.next_step}")
            self.open_step = step
            if type(step) is int:
                self.next_step = step
        elif event_type == "step/end":
            if self.open_step is None or turn != self.open_turn or step != self.open_step:
                violation("step-end-mismatch",
                          f"step/end {turn!r}/{step!r} but the open step is {self.open_turn!r}/{self.open_step!r}")
            if type(self.open_step) is int:
                self.next_step = self.open_step + 1
            self.open_step = None
            self.pending.clear()
        elif event_type in ("assistant/chunk", "assistant/message", "tool/call"):
            self._in_step(event_type, turn, step, violation)
            if event_type == "tool/call":
                self.pending.add(_call_key(d.get("callId")))
        elif event_type == "tool/result":
            if surface_op == "append":
                self._in_step(event_type, turn, step, violation)
                message = _object(d.get("message"))
                call_id = _object(message.get("source")).get("callId")
                content = message.get("content") or ()
                block = _object(content[0]) if content else {}
                error = _object(d.get("error"))
                not_started = block.get("isError") is True and error.get("code") == "TOOL_NOT_STARTED"
                if _call_key(call_id) not in self.pending and not not_started:
                    violation("tool-result-unpaired", f"tool/result for call {call_id!r} with no pending tool/call in this step")
                self.pending.discard(_call_key(call_id))
            elif self.open_turn is None:
                violation("rewrite-outside-turn", "tool/result replacement between turns")
        elif event_type in _TURN_SCOPED:
            if self.open_turn is None:
                violation("outside-turn", f"{event_type} between turns")
        return found

    def check_chunk_run(self, turn: Any, step: Any, seq0: int, count: int) -> list[Violation]:
        """``count`` delta chunks of one ``(turn, step)`` from ``seq0`` (a
        packed row): the violations of as many :meth:`check` calls, at once."""
        found = self.check("assistant/chunk", seq0, {"turn": turn, "step": step})
        if count > 1:
            self.last_seq = max(self.last_seq, seq0 + count - 1)
            if self.open_step is None or turn != self.open_turn or step != self.open_step:
                detail = (f"assistant/chunk names {turn!r}/{step!r} but the open step is "
                          f"{self.open_turn!r}/{self.open_step!r}")
                found.extend(Violation("outside-step", seq, turn, step, detail) for seq in range(seq0 + 1, seq0 + count))
        return found

    def _in_step(self, event_type: str, turn: Any, step: Any, violation: Any) -> None:
        if self.open_step is None or turn != self.open_turn or step != self.open_step:
            violation("outside-step",
                      f"{event_type} names {turn!r}/{step!r} but the open step is {self.open_turn!r}/{self.open_step!r}")
