"""Loading a v3/v4 log as dsh 0.2.1 reads it, line by line.

Stages, each with dsh's category:

1. every parsed row passes v4 admission (:mod:`.admission`), even in a
   crashed tail (corrupt-storage; a retired event type: unsupported-format);
2. rows decode and continue the seq (:mod:`.rows`); an unparsable or invalid
   row, or a gap, is a defect that a later ``turn/end`` proves is no crash
   tail (corrupt-storage);
3. at the end: the fork marker agrees with ``isSeeded``, the lifecycle
   relationships hold (:mod:`.relationships`, corrupt-storage); every type
   is known or ignorable (unsupported-format); every event is adoptable
   (:func:`.session.adopt_event`, corrupt-storage);
4. the surface fold (:class:`.session.V4State`, invalid-log).

Unlike v0, a v4 reader writes no closers for a turn a crash left open:
dsh's agent loop adds them when it continues the session.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

from msgspec import UNSET

from ...errors import CorruptionError, DecodeError, DshError, FormatUnsupportedError, IdentityError, ValidationError
from ...jsonvalue import decode_json, encode_json
from ...session_header import SessionHeader
from ...storage.layout import encode_segment
from .admission import admit_row, check_fork_result, check_retired_syntax, check_system_fields, check_tool_result
from .header import parse_header
from .lifecycle import Relationships
from .relationships import check_event
from .rows import decode_row
from .session import V4State, adopt_event
from .vocabulary import KNOWN_TYPES


def artifact_checks(event: dict[str, Any]) -> None:
    """What dsh's ``restoreReleasedV4Artifact`` checks of each event of a
    migrated log (a v4 file's rows had these checks on admission)."""
    if event["type"] not in KNOWN_TYPES:
        if event.get("ignorable") is not True:
            raise FormatUnsupportedError(f"format v4 contains unknown event type {_show(event['type'])} at seq "
                                         f"{event['seq']}")
        return
    check_retired_syntax(event)
    check_system_fields(event)
    check_tool_result(event)
    check_fork_result(event)

__all__ = ["V4Fold"]


class V4Fold:
    """The staged load of a v3/v4 session, fed one stored line at a time
    (see :mod:`dsh_core.loader`). Each whole-log stage keeps its
    first refusal as the events arrive; :meth:`finish` raises the earliest
    stage's, as dsh, which runs them one after another, would. Only the
    fold's state is kept, so memory follows the derived history."""

    format_version: ClassVar[int] = 4
    tolerates_defects: ClassVar[bool] = False
    #: of a migrated log, the format it was migrated from (the v0 chain sets 0 on its fold)
    source_version = 3

    def __init__(self, where: str, observer: Any = None, migrated: bool = False, folder: str | None = None) -> None:
        self.where = where
        #: the session folder the log was read from (dsh's layout): it must be the header id's
        self.folder = folder
        self.observer = observer
        #: fed by :class:`~dsh_core.formats.v3.fold.V3Fold`: each event is a migrated v3 event, checked as
        #: dsh checks a migration's result, and a refusal is the migration's (unsupported-format)
        self.migrated = migrated
        self._artifact_error: DshError | None = None
        self.header: SessionHeader | None = None
        self.state: V4State | None = None
        self.count = 0
        self._line_no = 0  # event lines, from 1 (dsh counts them without the header)
        self._issue: CorruptionError | None = None
        self._inherited: int | None = None
        self._relationships = Relationships()
        self._local_error: tuple[int, DshError] | None = None
        self._foreign_delivery: int | None = None  # a marker naming another session: the parent's, if inherited
        self._vocabulary_error: DshError | None = None
        self._adoption_error: DshError | None = None
        self._fold_error: DshError | None = None
        self._admission_error: DshError | None = None  # a consumer's record refused by row admission

    def header_value(self, parsed: Any) -> None:
        self.header = parse_header(parsed, self.where)
        self.state = V4State(self.header.id)

    # ------------------------------------------------------------ reader

    def event_line(self, line: bytes) -> bool:
        """Feed one complete line; returns whether it joined the committed prefix."""
        self._line_no += 1
        try:
            value = decode_json(line)
        except DecodeError:
            if self._issue is None:
                self._issue = CorruptionError(
                    f"{self.where}: corrupt session log: unparsable committed event at line {self._line_no}")
            return False
        try:
            admit_row(value)
        except DshError as exc:
            raise type(exc)(f"{self.where}: line {self._line_no}: {exc.message}") from None
        turn_end = isinstance(value, dict) and value.get("type") == "turn/end"
        if self._issue is not None:
            if turn_end:
                raise self._fatal()
            return False
        try:
            event = self._decode(value)
        except CorruptionError as exc:
            self._issue = CorruptionError(
                f"{self.where}: corrupt session log: invalid committed event at line {self._line_no}: {exc.message}")
            if turn_end:
                raise self._fatal()
            return False
        self.count += 1
        self._event(event)
        return True

    def _decode(self, value: Any) -> dict[str, Any]:
        """A parsed row as the event at the next seq; raises :class:`CorruptionError`."""
        event = decode_row(value, self.count)
        if type(event["seq"]) is not int or event["seq"] != self.count:
            raise CorruptionError(f"released v2 row {self.count} has seq gap (expected {self.count}, "
                                  f"got {_show(event['seq'])})")
        if event["type"] == "session/end-seed":
            if not isinstance(event["data"], dict):
                raise CorruptionError(f"session/end-seed {event['seq']} data must be an object")
            if event["data"].get("inherited") is True:
                self._inherited = event["seq"]
        return event

    def apply(self, line: bytes) -> None:
        """Fold one record value at the next seq (the caller checked the seq),
        as a consumer does with a log still being written. A value that is no
        row at this seq raises :class:`DecodeError` (the record is refused,
        not the log); a refusal of the log is :attr:`error` from then on."""
        try:
            value = decode_json(line)
            admit_row(value)
        except DecodeError as exc:
            raise DecodeError(f"{self.where}: seq {self.count}: {exc.message}") from None
        except DshError as exc:
            self._admission_error = self._admission_error or type(exc)(f"{self.where}: seq {self.count}: "
                                                                       f"{exc.message}")
            return
        try:
            event = self._decode(value)
        except CorruptionError as exc:
            raise DecodeError(f"{self.where}: seq {self.count}: invalid committed event: {exc.message}") from None
        self.count += 1
        self._event(event)

    @property
    def error(self) -> DshError | None:
        """The refusal of the log so far, as :meth:`finish` would raise it,
        leaving out what only the log's end decides (open lifecycles, the
        fork cut): ``None`` while the log holds."""
        return next(self._refusals(final=False), None)

    @property
    def idle(self) -> bool:
        """Whether no turn is open."""
        return self._relationships.turn is None

    @property
    def event_count(self) -> int:
        """The events folded."""
        return self.count

    @property
    def migrated_events(self) -> None:
        """A v4 log is read as it is: nothing migrated."""
        return None

    def migrated_event(self, event: dict[str, Any]) -> None:
        """Fold one event a migration produced (its seq is the next one)."""
        if event["type"] == "session/end-seed" and isinstance(event["data"], dict) and \
                event["data"].get("inherited") is True:
            self._inherited = event["seq"]
        if self._artifact_error is None:
            try:
                artifact_checks(event)
            except DshError as exc:
                self._artifact_error = exc
        self.count += 1
        self._event(event)

    @property
    def inherited(self) -> int | None:
        """The seq of the inherited end-seed marker (a fork's cut), if any."""
        return self._inherited

    def _fatal(self) -> CorruptionError:
        assert self._issue is not None
        return CorruptionError(f"{self._issue.message}, and a later turn/end shows it is not a crash tail")

    # ------------------------------------------------------------ stages

    def _event(self, event: dict[str, Any]) -> None:
        header, seq, event_type = self.header, event["seq"], event["type"]
        assert header is not None, "events come after the header"
        if self._local_error is None:
            try:
                foreign = check_event(header, event)
                if foreign and self._foreign_delivery is None:
                    self._foreign_delivery = seq
            except CorruptionError as exc:
                self._local_error = (seq, exc)
        self._relationships.feed(event)
        if self._vocabulary_error is None:
            if event_type not in KNOWN_TYPES and event.get("ignorable") is not True:
                self._vocabulary_error = FormatUnsupportedError(
                    f"session {header.id!r} contains event type {_show(event_type)} (seq {seq}) unknown to this "
                    "harness and not marked ignorable; refusing to interpret the log (it was likely written by a "
                    "newer harness)")
            elif event_type == "request/header" and isinstance(event["data"], dict) and \
                    event["data"].get("reason") == "fallback":
                self._vocabulary_error = FormatUnsupportedError(
                    f'session {header.id!r} contains a request/header event (seq {seq}) with the unsupported legacy '
                    'reason "fallback"; it was written by a retired pre-release harness')
        if self._vocabulary_error is not None or self._adoption_error is not None:
            return
        try:
            adopt_event(event)
        except CorruptionError as exc:
            self._adoption_error = CorruptionError(f"stored session {header.id!r} failed validation: {exc.message}")
            return
        if self._fold_error is not None:
            return
        observer, state = self.observer, self.state
        assert state is not None, "events come after the header"
        watched = observer is not None and event_type in observer.watched_types
        try:
            if watched:
                observer.before_event(event, state)
            state.apply(event)
        except (ValidationError, FormatUnsupportedError) as exc:
            self._fold_error = type(exc)(f"session {header.id!r} seq {seq} {_show(event_type)}: {exc.message}")
            return
        if watched:
            observer.after_event(event, state)

    def _local(self, final: bool) -> DshError | None:
        """The per-event stage's refusal, with a marker naming another session
        decided once the inherited prefix is known (``final``, or the cut seen)."""
        header = self.header
        assert header is not None, "a refusal comes after the header"
        foreign = self._foreign_delivery
        if foreign is not None and header.parentSession is not UNSET and self._inherited is None and not final:
            foreign = None  # a later inherited cut may show it is the parent's
        inherited = self._inherited if header.parentSession is not UNSET else None
        if foreign is not None and not (inherited is not None and foreign < inherited) and (
                self._local_error is None or foreign < self._local_error[0]):
            return CorruptionError("current-generation delivery marker names the wrong Session")
        return self._local_error[1] if self._local_error is not None else None

    def _refusals(self, final: bool) -> Iterator[DshError]:
        """The refusals of the stages in dsh's order; ``final``: the log ended."""
        header, where = self.header, self.where
        assert header is not None
        name = f"session {header.id!r}"
        if self._admission_error is not None:
            yield self._admission_error
        if final:
            self._relationships.finish()
        seeded = None
        if final and header.isSeeded != (self._inherited is not None):
            seeded = (("format v4 seeded header disagrees with its last inherited end-seed marker" if header.isSeeded
                       else "format v4 unseeded Session contains an inherited end-seed marker") if self.migrated
                      else "released v2 seeded Session lacks an inherited end-seed marker" if header.isSeeded
                      else "released v2 unseeded Session contains an inherited end-seed marker")
        if self.migrated:
            artifact = self._artifact_error or (CorruptionError(seeded) if seeded else None)
            for error in (artifact, self._local(final), self._relationships.error):
                if error is not None:
                    yield FormatUnsupportedError(f"{where}: {name}: Session migration from v{self.source_version} to "
                                                 f"v4 refuses the transformed artifact: {error.message}; the "
                                                 f"v{self.source_version} log stays as it is")
        else:
            if seeded:
                yield CorruptionError(f"{where}: {name}: {seeded}")
            for error in (self._local(final), self._relationships.error):
                if error is not None:
                    yield CorruptionError(f"{where}: {name}: stored log is corrupt: {error.message}")
        if final and self.folder is not None and self.folder != encode_segment(header.id):
            yield IdentityError(f"{where}: corrupt session log: requested id {self.folder!r} (its folder) does not "
                                f"match header id {header.id!r}")
        for error in (self._vocabulary_error, self._adoption_error, self._fold_error):
            if error is not None:
                yield type(error)(f"{where}: {error.message}")

    def finish(self) -> list[dict[str, Any]]:
        """End of the log: raises the earliest stage's refusal; returns the
        closers written (none: a v4 reader writes no crash repair)."""
        error = next(self._refusals(final=True), None)
        if error is not None:
            raise error
        return []

def _show(value: Any) -> str:
    try:
        return encode_json(value).decode()
    except Exception:  # noqa: BLE001 - only for an error message
        return repr(value)
