"""The staged fold of one stored session (docs/formats/v0.md §8.6–§8.9b), record by record.

The reference loads in stages, and a refusal's category follows from the
earliest stage that failed, not from the earliest seq:

1. reader (:meth:`StagedFold.event_line`): header line, record decoding,
   seq contiguity, torn tails → :class:`CorruptionError`
   (``corrupt-storage``);
2. format version, checked on the raw header line first →
   :class:`FormatUnsupportedError`;
3. ``shape_error``: retired vocabulary, legacy upgrades (incl. ``turn/end``
   shapes) and message shapes → ``invalid-log``;
4. ``vocabulary_error``: unknown event types without ``ignorable: true`` →
   ``unsupported-format``;
5. ``repair_error``: crash repair (closers for an open tail turn) cannot
   follow a payload it reads → ``invalid-log``;
6. ``validation_error``: seed validation (session header, envelope, request
   headers, seq, surface) → ``invalid-log``.

Stages 1 and 2 raise; stages 3–6 are remembered in those attributes.

Here every stage runs as each record arrives: the first failure of each
stage is remembered, later stages stop folding once one failed, and the
result picks the earliest stage. Nothing but the fold (and the open-turn
state for repair) is held, so memory follows the derived history, not the
file size. The loader (:mod:`dsh_core.loader`) feeds it
file lines; a consumer feeds it record values.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ...errors import CorruptionError, DecodeError, DshError, FormatUnsupportedError, ValidationError
from ...events import KNOWN_TYPES, RETIRED_TYPES, ROW_TAGS, SURFACE_TYPES, is_row
from ...json_depth import bounded
from ...jsonvalue import MAX_SAFE_INTEGER, decode_json, encode_json, float_hook
from ...session import SessionState
from ...session_header import SessionHeader, parse_header_line
from ...shapes import check_envelope, check_message_shape, check_retired
from ..contract import FoldObserver
from .legacy import upgrade_event
from ...storage.records import ChunkRow, decode_row, decode_row_line
from .repair import OpenTurnTracker
from ...storage.seq_ranges import decode_source_seqs

__all__ = ["StagedFold"]


# Known types no upgrade touches, with no surface, header or context effect.
_PASSIVE_TYPES = KNOWN_TYPES - SURFACE_TYPES - {"turn/start", "turn/end", "request/header", "request/context"}
# Passive types whose payload crash repair reads.
_REPAIR_TYPES = frozenset({"step/start", "step/end", "tool/call"})
# Types a legacy upgrade or the message-shape check may touch (shape_error).
_UPGRADED_TYPES = SURFACE_TYPES | {"turn/start", "turn/end", "steering/message", "request/header"}


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """A line that is a plain event envelope (the common case). Decoding
    proves everything ``check_envelope`` checks; a line it refuses takes the
    dict path, which names the problem."""

    type: str
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INTEGER)]
    time: Annotated[int, msgspec.Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
    data: msgspec.Raw
    surfaceOp: Any = UNSET
    sourceEventSeqs: Any = UNSET
    ignorable: Literal[True] | UnsetType = UNSET


_decode_envelope = bounded(msgspec.json.Decoder(_Envelope, float_hook=float_hook).decode)

class StagedFold:
    """The staged load of one session, fed one storage line at a time.

    The storage reader feeds it file lines (:meth:`event_line`, with dsh's
    crash-tail rules); a consumer feeds it record values whose seq it has
    already checked (:meth:`apply`). Each of stages 3–6 keeps its first
    refusal (``shape_error``, ``vocabulary_error``, ``repair_error``,
    ``validation_error``); :attr:`error` is the earliest stage's, if any.
    """

    format_version: ClassVar[int] = 0
    tolerates_defects: ClassVar[bool] = False

    def __init__(self, where: str, observer: FoldObserver | None) -> None:
        self.where = where
        self.observer = observer
        self._watched: frozenset[str] = observer.watched_types if observer is not None else frozenset()
        self.header: SessionHeader | None = None
        self.state: SessionState | None = None
        self.count = 0  # events the reader accepted (seq contiguity)
        self._line_no = 0
        self._issue: CorruptionError | None = None  # a defect that may still be a crash tail
        self.shape_error: DshError | None = None
        self.vocabulary_error: DshError | None = None
        self.repair_error: DshError | None = None
        self.validation_error: DshError | None = None
        self.tracker = OpenTurnTracker()

    # ---------------------------------------------------------------- header

    def header_value(self, parsed: Any) -> None:
        """Read the header line, as :func:`~dsh_core.formats.open_fold` decoded it."""
        self.header = parse_header_line(parsed, self.where)
        self.state = SessionState(self.header.id)
        try:
            self.header.validate()
        except ValidationError as exc:
            self.validation_error = exc

    # ------------------------------------------------------- reader (stage 1)

    @property
    def _header(self) -> SessionHeader:
        assert self.header is not None, "events come after the header"
        return self.header

    def event_line(self, line: bytes) -> bool:
        """Feed one complete line; returns whether it joined the committed prefix."""
        if self._issue is None:
            # Fast paths: a plain event envelope decodes straight into a
            # Struct (payload kept as raw JSON), a well-formed row into a
            # ChunkRow; anything unusual takes the full path.
            try:
                envelope = _decode_envelope(line)
            except (msgspec.DecodeError, msgspec.ValidationError, DecodeError):
                envelope = None
            if envelope is not None and envelope.seq == self.count and envelope.type not in ROW_TAGS:
                self._line_no += 1
                self.count += 1
                try:
                    self._envelope(envelope)
                    return True
                except DecodeError:  # a payload that is no JSON (say, not UTF-8): the full path names it
                    self._line_no -= 1
                    self.count -= 1
            row = decode_row_line(line) if envelope is None else None
            if row is not None and row.seq0 == self.count:
                self._line_no += 1
                self._rows(row)
                return True
        return self._line(line)

    def _line(self, line: bytes) -> bool:
        self._line_no += 1
        line_no = self._line_no + 1  # the header is line 1
        try:
            value = decode_json(line)
            row = decode_row(value) if is_row(value) else None
        except DecodeError as exc:
            if self._issue is None:
                self._issue = CorruptionError(f"{self.where}: line {line_no}: unparsable committed record ({exc})")
            return False
        if value is None:
            raise CorruptionError(f"{self.where}: line {line_no}: a record must not be null")
        holds_turn_end = row is None and isinstance(value, dict) and value.get("type") == "turn/end"
        if self._issue is not None:
            if holds_turn_end:
                raise self._fatal_defect()
            return False
        seq = row.seq0 if row is not None else (value.get("seq") if isinstance(value, dict) else None)
        if type(seq) is not int or seq != self.count:
            self._issue = CorruptionError(
                f"{self.where}: line {line_no}: seq gap in committed region (expected {self.count}, got {_show(seq)})")
            if holds_turn_end:
                raise self._fatal_defect()
            return False
        if row is not None:
            self._rows(row)
            return True
        if isinstance(value, dict) and "sourceEventSeqs" in value:
            try:
                value["sourceEventSeqs"] = decode_source_seqs(value["sourceEventSeqs"], seq)
            except DecodeError as exc:
                self._issue = CorruptionError(f"{self.where}: line {line_no}: unparsable committed record ({exc})")
                return False
        self.count += 1
        self._event(value)
        return True

    def apply(self, line: bytes) -> None:
        """Fold one record value at the next seq (the caller checked it);
        raises :class:`DecodeError` for a value that is no storage record."""
        try:
            envelope = _decode_envelope(line)
        except (msgspec.DecodeError, msgspec.ValidationError, DecodeError):
            envelope = None
        if envelope is not None and envelope.type not in ROW_TAGS:
            self.count += 1
            try:
                self._envelope(envelope)
            except DecodeError:  # its payload is no JSON: nothing was folded, the record is refused
                self.count -= 1
                raise
            return
        row = decode_row_line(line)
        if row is not None:
            self._rows(row)
            return
        value = decode_json(line)
        if is_row(value):
            self._rows(decode_row(value))
        elif isinstance(value, dict):
            if "sourceEventSeqs" in value:
                value["sourceEventSeqs"] = decode_source_seqs(value["sourceEventSeqs"], self.count)
            self.count += 1
            self._event(value)
        else:
            raise DecodeError(f"{self.where}: a record must be a JSON object, got {_show(value)[:80]}")

    @property
    def error(self) -> DshError | None:
        """The earliest-stage refusal so far (``None`` while the log is good)."""
        return self.shape_error or self.vocabulary_error or self.repair_error or self.validation_error

    @property
    def idle(self) -> bool:
        """Whether no turn is open."""
        return self.tracker.open_turn is None

    @property
    def event_count(self) -> int:
        """The events folded: the stored ones (closers join at :meth:`finish`)."""
        return self.count

    @property
    def migrated_events(self) -> None:
        """A v0 log is read as it is: nothing migrated."""
        return None

    def _fatal_defect(self) -> CorruptionError:
        issue = self._issue
        assert issue is not None
        return CorruptionError(f"{issue.message}, and a later turn/end shows it is not a crash tail")

    # ------------------------------------------------------------ stages 3–6

    def _envelope(self, envelope: _Envelope) -> None:
        event_type, seq, time = envelope.type, envelope.seq, envelope.time
        if (event_type in _PASSIVE_TYPES and envelope.surfaceOp is UNSET and envelope.sourceEventSeqs is UNSET
                and not (self.shape_error or self.vocabulary_error or self.repair_error or self.validation_error)):
            # A known type that no upgrade touches and that has no surface,
            # header or context effect: the envelope Struct already proved
            # what seed validation checks of it, so it folds to a count. Only crash repair and a
            # watching observer read payloads; the rest stay unparsed.
            watched = event_type in self._watched
            data = decode_json(envelope.data) if watched or event_type in _REPAIR_TYPES else None
            if event_type in _REPAIR_TYPES:
                self._observe_repair(event_type, seq, time, data)
            else:
                self.tracker.observe_passive(seq, time)
            if self.repair_error is not None:
                return
            state, observer = self.state, self.observer
            assert state is not None, "events come after the header"
            if watched and observer is not None:
                passive = {"type": event_type, "seq": seq, "time": time, "data": data}
                observer.before_event(passive, state)
                state.apply_chunk_run(seq, 1, time)
                observer.after_event(passive, state)
            else:
                state.apply_chunk_run(seq, 1, time)
            return
        event: dict[str, Any] = {"type": event_type, "seq": seq, "time": time, "data": decode_json(envelope.data)}
        if envelope.surfaceOp is not UNSET:
            event["surfaceOp"] = envelope.surfaceOp
        if envelope.sourceEventSeqs is not UNSET:  # the next seq: this one, when the caller checked it
            event["sourceEventSeqs"] = decode_source_seqs(envelope.sourceEventSeqs, min(seq, self.count - 1))
        if envelope.ignorable is not UNSET:
            event["ignorable"] = envelope.ignorable
        self._event(event, envelope_checked=True)

    def _observe_repair(self, event_type: Any, seq: Any, time: Any, data: Any) -> None:
        try:
            self.tracker.observe(event_type, seq, time, data)
        except (TypeError, KeyError, AttributeError, IndexError):
            self.repair_error = ValidationError(
                f'{self.where}: session {self._header.id!r} seq {seq} "{event_type}": '
                "payload cannot be followed for crash repair")

    def _rows(self, row: ChunkRow) -> None:
        # Delta chunks: known type, no message, no repair state, no surface.
        count = row.event_count
        self.count += count
        self.tracker.observe_passive(row.seq0 + count - 1, row.last_time)
        if self.shape_error or self.vocabulary_error or self.repair_error or self.validation_error:
            return
        state = self.state
        assert state is not None, "rows come after the header"
        try:
            state.apply_chunk_run(row.seq0, count, row.last_time)
        except ValidationError as exc:
            self.validation_error = exc
            return
        if self.observer is not None:
            self.observer.chunk_run(row, state)

    def _event(self, event: dict[str, Any], envelope_checked: bool = False) -> None:
        if self.shape_error is not None:
            return
        event_type = event.get("type")
        if not isinstance(event_type, str):  # dsh's Set.has is false for it: an unknown, unmarked type
            event_type = _show(event_type)
        try:  # shape_error
            if event_type in _UPGRADED_TYPES:
                check_retired(event_type, event.get("data"), lambda: self._where(event))
                header, state = self.header, self.state
                assert header is not None and state is not None, "events come after the header"
                event = upgrade_event(event, header.id, state.message_id_at)
                event_type = event.get("type")
                if event_type in SURFACE_TYPES:
                    check_message_shape(event_type, event.get("data"), lambda: self._where(event))
            elif event_type in RETIRED_TYPES:
                check_retired(event_type, event.get("data"), self._where(event))
        except ValidationError as exc:
            self.shape_error = exc
            return
        if self.vocabulary_error is None and event_type not in KNOWN_TYPES and event.get("ignorable") is not True:
            self.vocabulary_error = FormatUnsupportedError(
                f"{self._where(event)}: event type {_show(event_type)} is unknown to this build and not marked "
                "ignorable; refusing to interpret the log (it was likely written by a newer harness)")
        if self.vocabulary_error is not None:
            return
        if self.repair_error is None:
            self._observe_repair(event_type, event.get("seq"), event.get("time"), event.get("data"))
        if self.repair_error is not None or self.validation_error is not None:
            return
        self._fold(event, envelope_checked)

    def _where(self, event: dict[str, Any]) -> str:
        return f'{self.where}: session {self._header.id!r} seq {event.get("seq")} "{event.get("type")}"'

    def _fold(self, event: dict[str, Any], envelope_checked: bool = False) -> None:
        observer, state = self.observer, self.state
        assert state is not None, "events come after the header"
        try:
            if observer is not None:
                if not envelope_checked:  # an observer reads only events whose envelope holds
                    check_envelope(event, state.next_seq)
                    envelope_checked = True
                observer.before_event(event, state)
            state.check_and_apply(event, messages_checked=True, envelope_checked=envelope_checked)
        except ValidationError as exc:
            self.validation_error = exc
            return
        if observer is not None:
            observer.after_event(event, state)

    # ------------------------------------------------------------------ end

    def finish(self) -> list[dict[str, Any]]:
        """End of the log: raises the first refusal of any stage; otherwise
        folds and returns the closing events of a turn left open."""
        for error in (self.shape_error, self.vocabulary_error, self.repair_error):
            if error is not None:
                raise error
        closers = self.tracker.closers()
        for closer in closers:
            if self.validation_error is None:
                self._fold(closer)
        if self.validation_error is not None:
            raise self.validation_error
        return closers


def _show(value: Any) -> str:
    try:
        return encode_json(value).decode()
    except Exception:  # noqa: BLE001 - only for an error message
        return repr(value)

