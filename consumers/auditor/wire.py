"""Matching a gateway's wire attestations to the request boundaries of a
session's log.

Each agent-step request on the wire should be one request boundary of the
log, with an equal ``dsh-request/1`` digest (:mod:`dsh_core.wire_request`).
Matching is one to one by digest, in order; a verified pair is an anchor:
whatever is still unmatched before it, on either side, is settled then.
What an anchor never settles (the last requests of a session) is settled
once the partition's clock, the latest record timestamp the auditor saw on
it, is ``deadline`` past it. Settling pairs the oldest unmatched
attestation with the oldest unmatched boundary:

* both: ``request-mismatch``, naming what differs (settings, system text,
  tools, which message and which field);
* an attestation alone: ``unlogged-request``, unless its digest is that of
  a recent boundary (a request sent again, e.g. after the client went away
  mid-stream: dsh logs no attempt for it, the retry is logged);
* a boundary alone: ``unattested-request`` when the fleet requires the
  gateway (``require``), otherwise only counted.

Session titles and compaction summaries are classified, never matched.
Two kinds of attestation are never a finding of their own:

* a request the upstream refused (``outcome`` ``refused``, HTTP 401/403):
  the model saw nothing; it still verifies a boundary of equal digest
  (dsh may log its attempt), otherwise it is counted ``refused``;
* a request too large for the gateway to read (``algorithm``
  :data:`~dsh_core.wire_request.RAW_ALGORITHM`: the digest of its bytes,
  which no log rebuilds): paired like any other, its boundary counts as
  ``unchecked``, not a mismatch; alone, it is ``unlogged-request`` still.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from dsh_core.chat_wire import chat_completions_body
from dsh_core.errors import ValidationError
from dsh_core.jsonvalue import thaw
from dsh_core.request import Boundary
from dsh_core.formats import Format, messages_body
from dsh_core.wire_request import ALGORITHM, RAW_ALGORITHM, differences, normalize, request_parts, wire_digest

from .findings import Report

__all__ = ["Logged", "WireMatcher", "logged_request"]

#: Unmatched boundaries a session without any gateway attestation keeps
#: (an attestation published after its boundary still finds it).
_IDLE_WINDOW = 8
#: Unmatched boundaries or attestations kept at most; beyond, the oldest is settled.
_LIMIT = 256
_RECENT = 32


@dataclass
class Logged:
    """A request boundary no worker attestation covers."""

    seq: int
    turn: Any
    step: Any
    timestamp: int  # ms: the record that carried it
    wire: str | None
    digest: str | None
    parts: dict[str, Any] | None
    problem: str | None = None  # why the request could not be rebuilt


@dataclass
class _Sent:
    """An agent-step request a gateway forwarded."""

    gateway: str
    arrival: int | None  # as the attestation says (shown in findings, never computed with)
    wire: str
    status: int | None
    outcome: str
    timestamp: int
    digest: str | None  # of the dsh-request/1 form: None for a body the gateway did not read
    parts: dict[str, Any] | None
    problem: str | None
    algorithm: str = ALGORITHM

    def named(self) -> str:
        status = f"HTTP {self.status}" if self.status is not None else "no status"
        return f"request {self.arrival} through gateway {self.gateway} ({self.wire}, {status}, {self.outcome})"


def logged_request(log_format: Format, boundary: Boundary, state: Any, timestamp: int) -> Logged:
    """The request a dsh runtime of the log's format sends at ``boundary``
    (on its format's wire), rebuilt from the prefix (``state``) in ``dsh-request/1`` form."""
    wire = log_format.wire
    problem = None
    if state.header is None:
        problem = "no request header in force"
    elif wire is None:
        problem = f"requests of format v{log_format.version} are not rebuilt on the wire"
    else:
        try:
            header, messages = thaw(state.header), thaw(state.messages())
            body = (messages_body(header, thaw(state.context), messages) if wire == "messages"
                    else chat_completions_body(header, messages))
            normalized = normalize(wire, body)
            return Logged(boundary.seq, boundary.turn, boundary.step, timestamp, wire, wire_digest(normalized),
                          request_parts(normalized))
        except ValidationError as error:
            problem = error.message
        except (AttributeError, KeyError, TypeError, ValueError) as error:  # a shape dsh's serializer would not take
            problem = f"the prefix does not serialize ({type(error).__name__}: {error})"
    return Logged(boundary.seq, boundary.turn, boundary.step, timestamp, wire, None, None, problem)


class WireMatcher:
    def __init__(self, report: Report, require: bool) -> None:
        self.report = report
        self.require = require
        self.active = False  # a gateway attestation was seen
        self.logged: list[Logged] = []
        self.sent: list[_Sent] = []
        self.recent: deque[str] = deque(maxlen=_RECENT)

    @property
    def waiting(self) -> bool:
        return bool(self.sent) or (bool(self.logged) and (self.active or self.require))

    # -------------------------------------------------------------- arrivals

    def attestation(self, body: dict[str, Any], timestamp: int) -> None:
        self.active = True
        wire, kind = str(body.get("wire")), str(body.get("kind"))
        if kind != "agent":
            self.report.wire_verdict(wire, kind, "classified")
            return
        algorithm = str(body.get("algorithm", ALGORITHM))
        sent = _Sent(str(body.get("gateway")), body.get("arrival"), wire, body.get("status"),
                     str(body.get("outcome")), timestamp, body.get("digest") if algorithm == ALGORITHM else None,
                     body.get("parts"), body.get("problem"), algorithm)
        for index, logged in enumerate(self.logged):
            if sent.digest is not None and logged.digest == sent.digest:
                earlier, self.logged = self.logged[:index], self.logged[index + 1:]
                self._settle(self.sent, earlier)
                self.sent = []
                self.report.wire_verdict(wire, "agent", "verified")
                return
        self.sent.append(sent)
        if len(self.sent) > _LIMIT:
            self._settle(self.sent[:1], [])
            del self.sent[0]

    def boundary(self, logged: Logged) -> None:
        if logged.digest is not None:
            self.recent.append(logged.digest)
            for index, sent in enumerate(self.sent):
                if sent.digest == logged.digest:
                    earlier, self.sent = self.sent[:index], self.sent[index + 1:]
                    self._settle(earlier, self.logged)
                    self.logged = []
                    self.report.wire_verdict(sent.wire, "agent", "verified")
                    return
        self.logged.append(logged)
        limit = _LIMIT if self.active or self.require else _IDLE_WINDOW
        if len(self.logged) > limit:
            self._settle([], self.logged[:1])
            del self.logged[0]

    def settle_due(self, clock: int, deadline_ms: int) -> None:
        """Settle, oldest first, while the oldest attestation or boundary is
        ``deadline_ms`` older than ``clock``."""
        while ((self.sent and self.sent[0].timestamp + deadline_ms <= clock)
               or (self.logged and self.logged[0].timestamp + deadline_ms <= clock)):
            sent = self.sent[:1]
            logged = self.logged[:1] if not sent or self._pairs(sent[0]) else []
            del self.sent[:len(sent)], self.logged[:len(logged)]
            self._settle(sent, logged)

    # -------------------------------------------------------------- verdicts

    def _pairs(self, request: _Sent) -> bool:
        """Whether an attestation left unmatched stands for a boundary of its
        own: not a request sent again, nor one the upstream refused."""
        return not (request.digest is not None and request.digest in self.recent) and request.outcome != "refused"

    def _settle(self, sent: list[_Sent], logged: list[Logged]) -> None:
        unmatched = []
        for request in sent:
            if self._pairs(request):
                unmatched.append(request)
            else:  # sent again (the log holds it), or refused (the model saw nothing)
                self.report.wire_verdict(request.wire, "agent", "refused" if request.outcome == "refused"
                                         else "verified")
        for request, boundary in zip(unmatched, logged):
            if request.algorithm == RAW_ALGORITHM:
                self.report.wire_verdict(request.wire, "agent", "unchecked")
            else:
                self._mismatch(request, boundary)
        for request in unmatched[len(logged):]:
            self.report.wire_verdict(request.wire, "agent", "unlogged")
            why = (f": {request.problem}" if request.problem else
                   " (too large for the gateway to read: its content was not compared)"
                   if request.algorithm == RAW_ALGORITHM else "")
            self.report.finding("unlogged-request", None, f"{request.named()} matches no request boundary of the "
                                f"log{why}: the model saw a request the log cannot rebuild")
        for boundary in logged[len(unmatched):]:
            if self.active or self.require:
                self.report.wire_verdict(boundary.wire or "unknown", "agent", "unattested")
            if self.require:
                self.report.finding("unattested-request", boundary.seq, "a request boundary of the log that no "
                                    "gateway attested: the request reached the model some other way, or not at all",
                                    boundary.turn, boundary.step)

    def _mismatch(self, request: _Sent, boundary: Logged) -> None:
        self.report.wire_verdict(request.wire, "agent", "mismatch")
        if boundary.problem is not None:
            what = f"the log's request could not be rebuilt ({boundary.problem})"
        elif request.parts is not None and boundary.parts is not None:
            what = differences(request.parts, boundary.parts)
        else:
            what = "the digests differ" + ("" if request.parts is not None else " (the attestation carries no parts)")
        self.report.finding("request-mismatch", boundary.seq, f"{request.named()} is not the request the log "
                            f"rebuilds at seq {boundary.seq}: {what}", boundary.turn, boundary.step)

    # ----------------------------------------------------------------- state

    def to_json(self) -> dict[str, Any]:
        return {"active": self.active, "logged": [asdict(x) for x in self.logged],
                "sent": [asdict(x) for x in self.sent], "recent": list(self.recent)}

    @classmethod
    def from_json(cls, saved: dict[str, Any], report: Report, require: bool) -> "WireMatcher":
        matcher = cls(report, require)
        matcher.active = saved["active"]
        matcher.logged = [Logged(**x) for x in saved["logged"]]
        matcher.sent = [_Sent(**x) for x in saved["sent"]]
        matcher.recent.extend(saved["recent"])
        return matcher
