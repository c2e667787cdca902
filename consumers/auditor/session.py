"""One audited session: its fold and checks, its attestations, and what
the state store keeps of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dsh_core.errors import DecodeError, DshError, HeldLimitError
from dsh_core.formats import SessionFold, format_of, open_fold, opened_header
from dsh_core.fold_snapshot import restore_fold, snapshot_fold
from dsh_core.invariants import InvariantChecker
from dsh_core.jsonvalue import decode_json, dump_json, thaw
from dsh_core.request import Boundary, BoundaryTracker, MessagesDigest, request_frame
from dsh_kafka.records import SessionRecord, check_identity

from ..runtime.sequencing import AppliedDigest, AppliedDigests, HeldRecords
from ..runtime.writers import take_header
from .checks import BoundaryAudit
from .findings import Report
from .wire import WireMatcher, logged_request

__all__ = ["ATTESTATION_BYTES", "AuditedSession", "PENDING_LIMIT", "SavedSession"]

#: The largest attestation value taken (one is a small JSON object).
ATTESTATION_BYTES = 64 * 1024
#: Attestations a session keeps waiting for the events below their boundary.
PENDING_LIMIT = 1000


@dataclass(frozen=True)
class SavedSession:
    """What the state store keeps of a session."""

    partition: int
    fold: bytes | None
    state: bytes  # JSON: refusal, gap report, attested boundaries, checker states
    held: list[tuple[int, bytes, int]]
    pending: dict[int, bytes]  # attestation values by boundary seq
    digests: dict[int, AppliedDigest]  # of the records applied since the last snapshot, by seq
    deleted: bool = False  # the session was deleted: the store keeps nothing else of it


#: The stored digest of the record a session applied at a seq.
StoredDigest = Callable[[int], AppliedDigest | None]


@dataclass
class AuditedSession:
    session_id: str
    partition: int
    held: HeldRecords
    digests: AppliedDigests
    report: Report
    wire: WireMatcher  # gateway attestations and the boundaries they should match
    fold: SessionFold | None = None
    refused: bool = False
    conflicted: bool = False  # a second writer showed (reported once; its records are refused)
    deleted: bool = False  # delete-session fenced it: its later records are refused (deleted-session)
    gap_reported: int | None = None  # the missing seq last reported as a gap
    pending: dict[int, bytes] = field(default_factory=dict)  # attestation values by boundary seq
    attested: set[int] = field(default_factory=set)  # verified boundaries the fold has not passed yet
    request_digest: MessagesDigest = field(default_factory=MessagesDigest)
    frame_header: Any = None  # the request header the frame below was built from
    frame: tuple[bytes, bytes] = (b"", b"")
    clock: int = 0  # ms: the timestamp of the record being applied

    @classmethod
    def new(cls, session_id: str, partition: int, stored: StoredDigest, require_gateway: bool = False
            ) -> "AuditedSession":
        report = Report(session_id)
        return cls(session_id, partition, HeldRecords(session_id), AppliedDigests(session_id, stored), report,
                   wire=WireMatcher(report, require_gateway))

    # ------------------------------------------------------------ sequenced

    def next_seq(self) -> int | None:
        return self.fold.count if self.fold is not None else None

    def held_bytes(self) -> int:
        """Held records and the attestations waiting for their boundary."""
        return self.held.bytes + (sum(map(len, self.pending.values())) if self.pending else 0)

    def apply(self, value: bytes, count: int) -> bool:
        fold = self.fold
        assert fold is not None, "records are applied after the header"  # next_seq() is None before
        before = fold.count
        try:
            fold.apply(value)
        except DecodeError as error:
            self.refuse(error, before)
            return False
        if fold.error is not None:
            self.refuse(fold.error, before)
            return False
        self.report.events += fold.count - before
        self.verify_pending()
        return True

    def start(self, header: SessionRecord) -> bool:
        """Take the session header; ``False`` if it is refused. Raises
        :class:`IdentityError` for a header of another session, and
        :class:`ConflictingWriterError` for one of another writer than its
        records named first."""
        try:
            fold = open_fold(header.value, f"session {self.session_id!r}",
                             BoundaryAudit(self.report, self.attested, on_request=self._request))
        except DshError as error:
            self.refuse(error, 0)
            return False
        check_identity(header, opened_header(fold))
        take_header(header, opened_header(fold), self.digests)
        self.fold = fold
        return True

    def refuse(self, error: DshError, seq: int | None) -> None:
        self.refused = True
        self.report.finding(error.category, seq, f"{type(error).__name__}: {error.message}")

    # --------------------------------------------------------- attestations

    def _request(self, boundary: Boundary, state: Any) -> None:
        """A boundary no worker attestation covers: for the gateway's."""
        assert self.fold is not None, "boundaries come from the fold"
        self.wire.boundary(logged_request(format_of(self.fold), boundary, state, self.clock))

    def wire_attestation(self, arrival: int, value: bytes, timestamp: int) -> None:
        """A gateway's attestation of the ``arrival``-th request it forwarded
        for this session (raises :class:`DecodeError` like :meth:`attestation`)."""
        if len(value) > ATTESTATION_BYTES:
            raise DecodeError(f"session {self.session_id!r}: the wire attestation of request {arrival} is "
                              f"{len(value)} bytes, over the {ATTESTATION_BYTES}-byte limit")
        body = decode_json(value)
        if not isinstance(body, dict):
            raise DecodeError(f"session {self.session_id!r}: the wire attestation of request {arrival} is not a "
                              "JSON object")
        self.wire.attestation(body, timestamp)

    def attestation(self, boundary: int, value: bytes) -> None:
        """An attestation of the request sent at ``boundary``. Its value must
        be a JSON object of at most :data:`ATTESTATION_BYTES` (raises
        :class:`DecodeError` otherwise); at most :data:`PENDING_LIMIT` wait
        for their boundary (raises :class:`HeldLimitError` beyond)."""
        if len(value) > ATTESTATION_BYTES:
            raise DecodeError(f"session {self.session_id!r}: the attestation for boundary {boundary} is "
                              f"{len(value)} bytes, over the {ATTESTATION_BYTES}-byte limit")
        if not isinstance(decode_json(value), dict):
            raise DecodeError(f"session {self.session_id!r}: the attestation for boundary {boundary} is not a JSON "
                              "object")
        position = self.fold.count if self.fold is not None else 0
        if position > boundary:
            self.report.verdict("late")
            self.report.finding("attestation-late", boundary, f"attestation for boundary {boundary} arrived after "
                                f"seq {position - 1}; its prefix is gone")
            return
        if boundary not in self.pending and len(self.pending) >= PENDING_LIMIT:
            raise HeldLimitError(self.session_id, position, boundary, PENDING_LIMIT, PENDING_LIMIT * ATTESTATION_BYTES)
        self.pending[boundary] = value
        self.verify_pending()

    def verify_pending(self) -> None:
        """Check the attestation of the boundary the fold has reached, if any."""
        if not self.pending or self.fold is None:
            return
        assert self.fold is not None, "attestations wait for the fold"
        boundary = self.fold.count
        attestation = self.pending.pop(boundary, None)
        if attestation is None:
            return
        body = decode_json(attestation)
        state = self.fold.state
        self.attested.add(boundary)
        if state.header is None:
            self.report.verdict("no-header")
            self.report.finding("no-request-header", boundary, "an attested request with no request/header in force",
                                body.get("turn"), body.get("step"))
            return
        if state.header is not self.frame_header:
            self.frame_header, self.frame = state.header, request_frame(state.header, self.session_id)
        rebuilt = self.request_digest.of(state.current_messages(), state.surface.replace_generation, *self.frame)
        if rebuilt == body.get("digest"):
            self.report.verdict("verified")
            return
        self.report.verdict("mismatch")
        self.report.finding("request-mismatch", boundary,
                            f"the request sent (digest {body.get('digest')}) is not the one the log rebuilds "
                            f"({rebuilt}): model-visible content outside the log", body.get("turn"), body.get("step"))

    # ---------------------------------------------------------------- store

    def snapshot(self) -> SavedSession:
        """Everything later records need, for the state store."""
        fold = self.fold
        state: dict[str, Any] = {"refused": self.refused, "conflicted": self.conflicted, "deleted": self.deleted,
                                 "gapReported": self.gap_reported,
                                 "wire": self.wire.to_json(), "verdicts": dict(self.report.totals)}
        if fold is not None:
            self.attested.difference_update([seq for seq in self.attested if seq < fold.count])
            observer = fold.observer
            assert isinstance(observer, BoundaryAudit), "the auditor's folds are opened with its observer"
            state |= {"attested": sorted(self.attested), "boundaries": observer.boundaries.to_json(),
                      "invariants": observer.invariants.to_json()}
        return SavedSession(self.partition, snapshot_fold(fold) if fold is not None else None, dump_json(state),
                            self.held.rows(), dict(self.pending), self.digests.changes(), self.deleted)

    @classmethod
    def restore(cls, session_id: str, saved: SavedSession, stored: StoredDigest, require_gateway: bool = False
                ) -> "AuditedSession":
        state = decode_json(saved.state)
        report = Report(session_id)
        session = cls(session_id, saved.partition, HeldRecords(session_id, saved.held),
                      AppliedDigests(session_id, stored), report, pending=dict(saved.pending),
                      wire=WireMatcher.from_json(thaw(state["wire"]), report, require_gateway) if "wire" in state
                      else WireMatcher(report, require_gateway))
        session.refused, session.gap_reported = state["refused"], state["gapReported"]
        session.deleted = state.get("deleted", False)  # (states stored before deletions were fenced have none)
        session.conflicted = state.get("conflicted", False)  # (nor before second writers were kept out)
        report.totals.update(state.get("verdicts", {}))  # (states stored before counts were kept have none)
        if saved.fold is not None:
            session.attested.update(state["attested"])
            observer = BoundaryAudit(session.report, session.attested, BoundaryTracker.from_json(state["boundaries"]),
                                     InvariantChecker.from_json(state["invariants"]), session._request)
            session.fold = restore_fold(saved.fold, f"session {session_id!r}", observer)
        return session
