"""Each step of a session by the log's own clock: when its request began,
when the model's first output came, when it ended, and its tokens.

A :class:`StepClock` is fed each applied storage line with its
:class:`~dsh_core.event_time.LineTime` and the usage the fold counted in
it. A step (``turn``, ``step``, as its events name them) starts at its
``step/start``, its first output is its first chunk (v0) or the first
streamed chunk of its first model message (v3, v4), and it ends at its
last event (its ``step/end`` once there is one). Its tokens are its model
messages' usage, and its model the last one's. A line naming no turn and
step of numbers belongs to no step.

The clock hands the rows changed since it was last asked
(:meth:`StepClock.changed`), whole, so writing them again writes the same
rows. A restored session's clock starts from the rows the store holds
(:meth:`StepClock.resume`).
"""

from __future__ import annotations

from typing import Any

from dsh_core.event_time import LineTime

__all__ = ["STEP_COLUMNS", "StepClock", "StepRow"]

#: A step row's columns after the session id, as the store keeps them.
STEP_COLUMNS = ("turn", "step", "started_at", "output_at", "ended_at", "provider", "model", "input_tokens",
                "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
#: The usage kinds a log counts, in the order of the row's token columns.
_KINDS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")

StepRow = list[Any]  # the values of STEP_COLUMNS


class StepClock:
    """The step rows of one session, by ``(turn, step)``."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int], StepRow] = {}
        self._dirty: set[tuple[int, int]] = set()

    def resume(self, rows: list[StepRow]) -> None:
        """Continue from stored rows."""
        self._rows = {(row[0], row[1]): list(row) for row in rows}

    def observe(self, line: LineTime, usage: list[tuple[str, str, dict[str, int]]]) -> None:
        """One applied line and the usage ``(provider, model, counts)`` the
        fold counted in it."""
        if line.turn is None or line.step is None:
            return
        key = (line.turn, line.step)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = [line.turn, line.step, None, None, None, None, None, 0, 0, 0, 0, 0]
        if line.type == "step/start" or row[2] is None:
            row[2] = line.first
        if line.output_at is not None and row[3] is None:
            row[3] = line.output_at
        row[4] = line.last if row[4] is None else max(row[4], line.last)
        self._dirty.add(key)
        for provider, model, counts in usage:
            row[5], row[6] = provider, model
            for index, kind in enumerate(_KINDS):
                row[7 + index] += counts.get(kind, 0)

    def changed(self) -> list[StepRow]:
        """The rows changed since the last call."""
        rows = [list(self._rows[key]) for key in sorted(self._dirty)]
        self._dirty = set()
        return rows
