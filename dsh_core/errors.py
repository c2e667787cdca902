"""The error tree of dsh-pipeline.

::

    DshError                      root; carries a ``category``
    ├── DecodeError               bytes that are not a JSON value / record at all
    │   └── SessionIdError        a record key that cannot be a session id (invalid-session-id)
    ├── InternalError             a record this code failed on unexpectedly (internal)
    ├── HeldLimitError            a session already holds the most records a gap may hold (held-limit)
    ├── DeletedSessionError       a record of a session deleted before it (deleted-session)
    ├── UnstorableError           a session's rows a store refuses for their content (unstorable)
    ├── CorruptionError           stored log refused by the reader (corrupt-storage)
    │   └── SequenceGapError      a log's seq does not continue where ``expected`` was due
    ├── FormatUnsupportedError    intact but unreadable: format version, unknown
    │                             required event type (unsupported-format)
    ├── ValidationError           a value or event breaks a spec rule (invalid-log)
    │   ├── LosslessJsonError     not lossless JSON (v0 §3), names the JSON path
    │   ├── EnvelopeError         event envelope keys / seq / time (v0 §1)
    │   ├── SurfaceError          surfaceOp / sourceEventSeqs / replace rules (v0 §4)
    │   ├── MessageShapeError     message payload shapes (v0 §8.6 step 5)
    │   ├── RequestHeaderError    request/header checks (v0 §6.1), retired vocabulary
    │   ├── LegacyShapeError      malformed legacy v0 shape (v0 §8.10)
    │   ├── SessionHeaderError    session header fields (v0 §8.2) at restore
    │   ├── IdentityError         a record's value names another session than its key (identity)
    │   │   └── ConflictingWriterError  a second writer of a session (conflicting-writer)
    │   └── ForkError             fork boundary rules (v0 §7.2)
    └── PipelineError             infrastructure: configuration, files, services (pipeline)
        └── LayoutError           a session log is not where dsh's directory layout keeps it

The infrastructure branch grows next to the layers that raise it, each a
``PipelineError``: the Kafka edge's in :mod:`dsh_kafka.errors`, the services'
state stores' in :mod:`consumers.runtime.errors`, the producers' in
:mod:`producers.errors`. ``except DshError`` or ``except PipelineError``
takes them all.

Every message says what was expected, what was found and where: session id and
seq, file and line, ``topic[partition]@offset``, a path, or a JSON path.
A person sees ``<command>: <ErrorClass>: <message>``, never a traceback.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "Category",
    "DshError",
    "DecodeError",
    "SessionIdError",
    "InternalError",
    "CorruptionError",
    "SequenceGapError",
    "FormatUnsupportedError",
    "ValidationError",
    "LosslessJsonError",
    "EnvelopeError",
    "SurfaceError",
    "MessageShapeError",
    "RequestHeaderError",
    "LegacyShapeError",
    "SessionHeaderError",
    "IdentityError",
    "ConflictingWriterError",
    "ForkError",
    "PipelineError",
    "LayoutError",
    "HeldLimitError",
    "DeletedSessionError",
    "UnstorableError",
]

#: The coarse classes of refusals and audit findings: an error's
#: ``category``, a dead letter's ``dsh-dlq-reason``, a finding's category
#: and the conformance output all use these words.
Category = Literal["corrupt-storage", "invalid-session-id", "unsupported-format", "invalid-log", "identity",
                   "conflicting-writer", "held-limit", "deleted-session", "unstorable", "internal", "invariant",
                   "reconstruction", "pipeline"]


class DshError(Exception):
    """Root of every error raised by dsh-pipeline code; ``category`` is the
    coarse class used by conformance output, dead letters and findings."""

    category: Category = "pipeline"

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class DecodeError(DshError):
    """Raised when bytes cannot be decoded into the JSON value or record expected."""

    category: Category = "corrupt-storage"


class SessionIdError(DecodeError):
    """Raised for a record whose key cannot be a session id: it holds NUL,
    which no dsh session folder, file name or PostgreSQL text holds, so
    no store could keep the session apart from others."""

    category: Category = "invalid-session-id"


class InternalError(DshError):
    """A record that made this code fail in a way it does not expect (a bug
    here, found by hostile input): the record is dead-lettered with the
    exception's class and the service goes on."""

    category: Category = "internal"


class CorruptionError(DshError):
    """Raised when the storage reader refuses a stored log (framing, header line,
    record decoding, seq contiguity before a later ``turn/end``, zstd frames)."""

    category: Category = "corrupt-storage"


class SequenceGapError(CorruptionError):
    """Raised when a session's log does not continue at seq ``expected`` but
    at ``got`` (a shipped file whose records skip or repeat seqs)."""

    def __init__(self, session_id: str, expected: int, got: int, where: str = "") -> None:
        self.session_id = session_id
        self.expected = expected
        self.got = got
        location = f" at {where}" if where else ""
        super().__init__(f"session {session_id!r}: expected seq {expected}, got {got}{location}")


class FormatUnsupportedError(DshError):
    """Raised when a log is intact but written in a format this build does not
    read: a header ``version`` other than 0, or an event type outside the known
    vocabulary that is not marked ``ignorable``."""

    category: Category = "unsupported-format"


class ValidationError(DshError):
    """Raised when a value or an event breaks a rule of the session-log spec."""

    category: Category = "invalid-log"


class LosslessJsonError(ValidationError):
    """Raised when data would not survive a JSON round trip unchanged (v0 §3)."""


class EnvelopeError(ValidationError):
    """Raised for an event envelope with extra keys, a non-contiguous ``seq``,
    a fractional ``time``, a wrong ``ignorable`` marker or a retired type."""


class SurfaceError(ValidationError):
    """Raised when ``surfaceOp``/``sourceEventSeqs`` or a replace breaks v0 §4.1."""


class MessageShapeError(ValidationError):
    """Raised when a message-carrying event lacks the shape of v0 §8.6 step 5."""


class RequestHeaderError(ValidationError):
    """Raised for a ``request/header`` that fails v0 §6.1, or retired header vocabulary."""


class LegacyShapeError(ValidationError):
    """Raised when a pre-current (v0 legacy) event shape is malformed (v0 §8.10)."""


class SessionHeaderError(ValidationError):
    """Raised when a session header's fields break v0 §8.2 when a log is restored."""


class IdentityError(ValidationError):
    """Raised for a record whose value names a session other than its key's
    (the key is the record's identity)."""

    category: Category = "identity"


class ConflictingWriterError(IdentityError):
    """Raised for a record of a second writer of a session: one tagged with
    another writer than the session's header, a second header differing from
    the first, or other bytes at a seq the session already applied or holds
    (never a duplicate). ``what`` says which."""

    category: Category = "conflicting-writer"

    def __init__(self, session_id: str, seq: int, what: str) -> None:
        self.session_id = session_id
        self.seq = seq
        super().__init__(f"session {session_id!r} seq {seq}: {what}; two writers share this session id")


class ForkError(ValidationError):
    """Raised when a fork boundary is not an existing seq or lies in an open turn."""


class PipelineError(DshError):
    """Raised for infrastructure failures: configuration, a service's files,
    the services around the domain (each layer's own branch)."""


class LayoutError(PipelineError):
    """Raised for a session log that is not where dsh's directory layout
    keeps it (``<root>/<project>/<session-id>/session[.vN].jsonl[.zstd]``): a
    log directly in a root or a project folder, a session folder without its
    project, a header whose session id belongs in another folder. The data
    may be fine; it is in the wrong place."""


class HeldLimitError(DshError):
    """Raised for a record of a session that already holds ``limit`` records
    (or ``byte_limit`` bytes) above a missing seq; the record is
    dead-lettered (re-shipping the session brings it back once the gap is
    filled)."""

    category: Category = "held-limit"

    def __init__(self, session_id: str, waiting_for: int, seq: int, limit: int, byte_limit: int) -> None:
        self.session_id = session_id
        self.waiting_for = waiting_for
        self.seq = seq
        super().__init__(f"session {session_id!r} waits for seq {waiting_for} and keeps at most {limit} later "
                         f"records of {byte_limit} bytes in all; seq {seq} is dead-lettered")


class DeletedSessionError(DshError):
    """Raised for a record of a session that was deleted (``delete-session``)
    before it arrived: a deletion is final, so nothing comes back of the
    session; its dead letter names the record but does not carry its value."""

    category: Category = "deleted-session"

    def __init__(self, session_id: str, seq: int, where: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} was deleted; its record at seq {seq} ({where}) is not taken")


class UnstorableError(DshError):
    """Raised when a store refuses a session's rows for what they hold (a
    number beyond its 64-bit columns, a constraint), never for the store
    itself: the records that made them are dead-lettered and the session
    is refused; the service goes on."""

    category: Category = "unstorable"

