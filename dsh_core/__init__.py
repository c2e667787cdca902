"""dsh_core: the DeepSeek Harness session log in Python.

Pure domain and codecs: event types, lossless JSON, surface fold, derived
messages, request reconstruction, invariants and dsh's JSONL + zstd storage
format. It names no Kafka concept and does no network I/O (a test reads the
imports); the Kafka edge, ``dsh_kafka``, builds on it.
"""

from .derive import derive_event_message
from .errors import (
    CorruptionError,
    DecodeError,
    DshError,
    EnvelopeError,
    ForkError,
    FormatUnsupportedError,
    LegacyShapeError,
    LosslessJsonError,
    MessageShapeError,
    PipelineError,
    RequestHeaderError,
    SequenceGapError,
    SessionHeaderError,
    SurfaceError,
    ValidationError,
)
from .events import KNOWN_TYPES, SURFACE_TYPES, Event
from .request_header import canonical_header, fold_request_header, header_equals
from .invariants import InvariantChecker, Violation
from .jsonvalue import canonical_json, decode_json, encode_json, sha256_jcs
from .lossless import check_lossless, snapshot
from .request import Boundary, BoundaryTracker, build_request, request_digest
from .session import SessionLog, SessionState
from .session_header import FORMAT_VERSION, SessionHeader
from .formats.v0.repair import interrupted_turn_closers
from .loader import load_session, load_session_bytes
from .storage import (
    LoadResult,
    SessionFileWriter,
    commit_repair,
    encode_batch,
    encode_segment,
    pack_chunk_runs,
    project_key,
)
from .surface import fold_surface

__all__ = [
    "Boundary", "BoundaryTracker", "CorruptionError", "DecodeError", "DshError", "EnvelopeError", "Event",
    "FORMAT_VERSION", "ForkError", "FormatUnsupportedError", "InvariantChecker", "KNOWN_TYPES",
    "LegacyShapeError", "LoadResult", "LosslessJsonError", "MessageShapeError", "PipelineError",
    "RequestHeaderError", "SURFACE_TYPES", "SequenceGapError", "SessionFileWriter", "SessionHeader",
    "SessionHeaderError", "SessionLog", "SessionState", "SurfaceError", "ValidationError", "Violation",
    "build_request", "canonical_header", "canonical_json", "check_lossless", "commit_repair", "decode_json",
    "derive_event_message", "encode_batch", "encode_json", "encode_segment", "fold_request_header",
    "fold_surface", "header_equals", "interrupted_turn_closers", "load_session", "load_session_bytes",
    "pack_chunk_runs", "project_key", "request_digest", "sha256_jcs", "snapshot",
]
