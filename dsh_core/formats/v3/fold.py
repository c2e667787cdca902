"""Reading a v3 log (dsh 0.1.5) as dsh 0.2.1 does: migrated to v4 in memory.

v3 is v4's stream model with older message shapes: a tool result is a
``role: "user"`` message holding one ``tool-result`` block, and runtime
messages name their producer as ``{kind: "plugin", plugin: NAME}``. Each
stored row is checked as v3 (:mod:`.admission`), then rewritten by the v3→v4 edge (dsh's
``ReleasedV3ToV4Stage``, :mod:`.to_v4`) and handed to the v4 fold, whose refusals are
then dsh's migration refusals (unsupported-format): the v3 source is
intact, this build just cannot carry it over.

The edge, per event: an ``interrupted`` ``turn/end`` before a turn that a
restart opened while the previous one was still open (later seqs shift
and every reference is remapped); unknown ignorable types become
``plugin:<type>``; plugin sources get their producer's kind; a wrapped tool
result becomes a tool-role message; unknown content tags become
``plugin:<tag>``. Unlike v4, a bad row without a later ``turn/end`` ends the
log there (dsh's migrating reader keeps the prefix).
"""

from __future__ import annotations

from typing import Any, ClassVar

from msgspec import UNSET

from ...errors import CorruptionError, DecodeError, DshError
from ...jsonvalue import decode_json
from ..v4.fold import V4Fold, _show
from ..v4.rows import decode_row
from .admission import V3_TYPES, admit_row, check_envelope
from .catalog import catalog_children
from .to_v4 import V3MigrationRefusal, lift_tool_result, messages, remap, source, tags

__all__ = ["V3Fold"]

class V3Fold:
    """The line sink of a v3 load: v3 rows, the v3→v4 edge, the v4 fold."""

    format_version: ClassVar[int] = 3
    #: a bad row without a later ``turn/end`` ends the log (no corruption)
    tolerates_defects: ClassVar[bool] = True

    def __init__(self, where: str, observer: Any = None, folder: str | None = None, keep: bool = False,
                 children: list[dict[str, Any]] | None = None) -> None:
        self.where = where
        #: with ``keep``, the subagent children dsh's migration catalogues at the log's end (:mod:`.catalog`)
        self.children = children or []
        self.v4 = V4Fold(where, observer, migrated=True, folder=folder)
        #: with ``keep``, every migrated event (what :mod:`dsh_core.migration.migrate` writes)
        self.events: list[dict[str, Any]] | None = [] if keep else None
        self.count = 0  # stored (v3) events
        self._line_no = 0
        self._issue: CorruptionError | None = None
        self._mapping: list[int] = []
        self._turn: int | None = None
        self._step_open = False
        self._next_turn_spliced = False
        self._foreign_delivery: int | None = None
        self._refusal: DshError | None = None  # a consumer's record that ended the log's migration

    @property
    def header(self) -> Any:
        return self.v4.header

    @property
    def state(self) -> Any:
        return self.v4.state

    @property
    def observer(self) -> Any:
        return self.v4.observer

    @property
    def event_count(self) -> int:
        """The events folded, as migrated to v4 (a restart's closers included)."""
        return self.v4.count

    @property
    def migrated_events(self) -> list[dict[str, Any]] | None:
        """With ``keep``, every event as migrated (what :mod:`dsh_core.migration.migrate` writes)."""
        return self.events

    def header_value(self, parsed: Any) -> None:
        self.v4.header_value(parsed)

    def event_line(self, line: bytes) -> bool:
        self._line_no += 1
        try:
            row = decode_json(line)
        except DecodeError:
            if self._issue is None:
                self._issue = CorruptionError(f"{self.where}: corrupt session log: row {self._line_no} is not valid JSON")
            return False
        turn_end = isinstance(row, dict) and row.get("type") == "turn/end"
        if self._issue is not None:
            if turn_end:
                raise self._issue
            return False
        try:
            admit_row(row)
        except DshError as exc:
            raise type(exc)(f"{self.where}: line {self._line_no}: {exc.message}") from None
        try:
            event = self._decode(row)
        except CorruptionError as exc:
            self._issue = CorruptionError(f"{self.where}: corrupt session log: invalid committed event at line "
                                          f"{self._line_no}: {exc.message}")
            if turn_end:
                raise self._issue from None
            return False
        self._fold(event)
        return True

    def _decode(self, row: Any) -> dict[str, Any]:
        """A parsed row as the v3 event at the next seq; raises :class:`CorruptionError`."""
        event = decode_row(row, self.count)
        if type(event["seq"]) is not int or event["seq"] != self.count:
            raise CorruptionError(f"released v2 row {self.count} has seq gap (expected {self.count}, "
                                  f"got {_show(event['seq'])})")
        check_envelope(event)
        return event

    def _fold(self, event: dict[str, Any]) -> None:
        self.count += 1
        try:
            for migrated in self._migrate(event):
                self.v4.migrated_event(migrated)
                if self.events is not None:
                    self.events.append(migrated)
        except V3MigrationRefusal as exc:
            raise V3MigrationRefusal(f"{self.where}: @deepseek-ai/dsh-session-format-v3-to-v4 refuses this format v3 "
                           f"Session: {exc.message}") from None

    def apply(self, line: bytes) -> None:
        """Fold one record value at the next seq, as a consumer does (see
        :meth:`V4Fold.apply <dsh_core.formats.v4.fold.V4Fold.apply>`)."""
        try:
            row = decode_json(line)
            admit_row(row)
        except DecodeError as exc:
            raise DecodeError(f"{self.where}: seq {self.count}: {exc.message}") from None
        except DshError as exc:
            self._refusal = self._refusal or type(exc)(f"{self.where}: seq {self.count}: {exc.message}")
            return
        try:
            event = self._decode(row)
        except CorruptionError as exc:
            raise DecodeError(f"{self.where}: seq {self.count}: invalid committed event: {exc.message}") from None
        try:
            self._fold(event)
        except V3MigrationRefusal as exc:
            self._refusal = self._refusal or exc

    @property
    def error(self) -> DshError | None:
        """The refusal of the log so far (see :attr:`V4Fold.error <dsh_core.formats.v4.fold.V4Fold.error>`)."""
        return self._refusal or self.v4.error

    @property
    def idle(self) -> bool:
        return self.v4.idle

    def _migrate(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        data = event["data"]
        restarted = (event["type"] == "turn/start" and self._turn is not None and not self._step_open
                     and self._next_turn_spliced and isinstance(data, dict) and data.get("turn") == self._turn + 1)
        if restarted:
            out.append({"type": "turn/end", "seq": self.v4.count, "time": event["time"],
                        "data": {"turn": self._turn, "reason": {"kind": "interrupted"}}})
        self._next_turn_spliced = (event["type"] == "agent/inbox/spliced" and isinstance(data, dict)
                                   and data.get("target") == "next-turn" and isinstance(data.get("inserted"), list)
                                   and len(data["inserted"]) > 0)
        if event["type"] == "turn/start" and isinstance(data, dict) and type(data.get("turn")) is int:
            self._turn = data["turn"]
        elif event["type"] == "turn/end":
            self._turn = None
        elif event["type"] in ("step/start", "step/end"):
            self._step_open = event["type"] == "step/start"
        target = self.v4.count + len(out)
        if event["type"] == "session-log-deepseek/delivery-accepted" and isinstance(data, dict):
            if data.get("sessionFormatVersion") == 4:
                raise V3MigrationRefusal("format v3 delivery marker claims target format v4")
            version = data.get("sessionFormatVersion", 0)
            if version == 3 and data.get("sessionId") != self.header.id and self._foreign_delivery is None:
                self._foreign_delivery = event["seq"]
        if event.get("ignorable") is True and event["type"] not in V3_TYPES:
            self._mapping.append(target)
            out.append({**event, "seq": target, "type": f"plugin:{event['type']}"})
            return out
        if event["type"] not in V3_TYPES:
            raise V3MigrationRefusal(f"format v3 contains unknown event type {_show(event['type'])} at seq {event['seq']}")
        moved = remap(event, target, self._mapping)
        self._mapping.append(target)
        moved = messages(moved, lambda message: source(message, event["seq"]))
        out.append(tags(lift_tool_result(moved)))
        return out

    def finish(self) -> list[dict[str, Any]]:
        if self.children and self.events is not None:
            catalog_children(self.v4, self.events, self.children)
        header = self.header
        cut = self.v4.inherited
        if self._foreign_delivery is not None and (header.parentSession is UNSET or cut is None
                                                   or self._foreign_delivery >= cut):
            raise V3MigrationRefusal(f"{self.where}: @deepseek-ai/dsh-session-format-v3-to-v4 refuses this format v3 Session: "
                           "current-generation delivery marker names the wrong Session")
        return self.v4.finish()

