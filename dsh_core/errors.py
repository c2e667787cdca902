"""The error tree of dsh-pipeline.

::

    DshError                      root; carries ``retriable`` and a ``category``
    ├── DecodeError               bytes that are not a JSON value / record at all
    ├── CorruptionError           stored log refused by the reader (corrupt-storage)
    ├── FormatUnsupportedError    intact but unreadable: format version, unknown
    │                             required event type (unsupported-format)
    ├── ValidationError           a value or event breaks a spec rule (invalid-log)
    │   ├── LosslessJsonError     not lossless JSON (§3), names the JSON path
    │   ├── EnvelopeError         event envelope keys / seq / time (§1)
    │   ├── SurfaceError          surfaceOp / sourceEventSeqs / replace rules (§4)
    │   ├── MessageShapeError     message payload shapes (§8.6 step 5)
    │   ├── RequestHeaderError    request/header checks (§6.1), retired vocabulary
    │   ├── LegacyShapeError      malformed legacy v0 shape (§8.10)
    │   ├── SessionHeaderError    session header fields (§8.2) at restore
    │   └── ForkError             fork boundary rules (§7.2)
    ├── SequenceGapError          a consumer saw seq ``got`` where ``expected`` was due
    └── PipelineError             infrastructure: Kafka, broker, topics, config

Every message says what was expected, what was found and where: session id and
seq, file and line, ``topic[partition]@offset`` or a JSON path.
"""

from __future__ import annotations

__all__ = [
    "DshError",
    "DecodeError",
    "CorruptionError",
    "FormatUnsupportedError",
    "ValidationError",
    "LosslessJsonError",
    "EnvelopeError",
    "SurfaceError",
    "MessageShapeError",
    "RequestHeaderError",
    "LegacyShapeError",
    "SessionHeaderError",
    "ForkError",
    "SequenceGapError",
    "PipelineError",
]


class DshError(Exception):
    """Root of every error raised by dsh-pipeline code.

    ``retriable`` tells retry loops whether trying the same operation again can
    succeed; ``category`` is the coarse class used by conformance output and
    dead-letter reasons.
    """

    retriable: bool = False
    category: str = "other"

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class DecodeError(DshError):
    """Raised when bytes cannot be decoded into the JSON value or record expected."""

    category = "corrupt-storage"


class CorruptionError(DshError):
    """Raised when the storage reader refuses a stored log (framing, header line,
    record decoding, seq contiguity before a later ``turn/end``, zstd frames)."""

    category = "corrupt-storage"


class FormatUnsupportedError(DshError):
    """Raised when a log is intact but written in a format this build does not
    read: a header ``version`` other than 0, or an event type outside the known
    vocabulary that is not marked ``ignorable``."""

    category = "unsupported-format"


class ValidationError(DshError):
    """Raised when a value or an event breaks a rule of the session-log spec."""

    category = "invalid-log"


class LosslessJsonError(ValidationError):
    """Raised when data would not survive a JSON round trip unchanged (§3)."""


class EnvelopeError(ValidationError):
    """Raised for an event envelope with extra keys, a non-contiguous ``seq``,
    a fractional ``time``, a wrong ``ignorable`` marker or a retired type."""


class SurfaceError(ValidationError):
    """Raised when ``surfaceOp``/``sourceEventSeqs`` or a replace breaks §4.1."""


class MessageShapeError(ValidationError):
    """Raised when a message-carrying event lacks the shape of §8.6 step 5."""


class RequestHeaderError(ValidationError):
    """Raised for a ``request/header`` that fails §6.1, or retired header vocabulary."""


class LegacyShapeError(ValidationError):
    """Raised when a pre-current (v0 legacy) event shape is malformed (§8.10)."""


class SessionHeaderError(ValidationError):
    """Raised when a session header's fields break §8.2 when a log is restored."""


class ForkError(ValidationError):
    """Raised when a fork boundary is not an existing seq or lies in an open turn."""


class SequenceGapError(DshError):
    """Raised when a consumer expected seq ``expected`` of a session and got ``got``."""

    category = "sequence"

    def __init__(self, session_id: str, expected: int, got: int, where: str = "") -> None:
        self.session_id = session_id
        self.expected = expected
        self.got = got
        location = f" at {where}" if where else ""
        super().__init__(
            f"session {session_id!r}: expected seq {expected}, got {got}{location}"
        )


class PipelineError(DshError):
    """Raised for infrastructure failures: broker, topics, client configuration."""

    category = "pipeline"
