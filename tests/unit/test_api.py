"""The public surface of dsh_core is pinned: changing it is a decision."""

import dsh_core
import dsh_core.storage


def test_dsh_core_exports():
    assert sorted(dsh_core.__all__) == sorted([
        "Boundary", "BoundaryTracker", "CorruptionError", "DecodeError", "DshError", "EnvelopeError", "Event",
        "FORMAT_VERSION", "ForkError", "FormatUnsupportedError", "InvariantChecker", "KNOWN_TYPES",
        "LegacyShapeError", "LoadResult", "LosslessJsonError", "MessageShapeError", "PipelineError",
        "RequestHeaderError", "SURFACE_TYPES", "SequenceGapError", "SessionFileWriter", "SessionHeader",
        "SessionHeaderError", "SessionLog", "SessionState", "SurfaceError", "ValidationError", "Violation",
        "build_request", "canonical_header", "canonical_json", "check_lossless", "commit_repair", "decode_json",
        "derive_event_message", "encode_batch", "encode_json", "encode_segment", "fold_request_header",
        "fold_surface", "header_equals", "interrupted_turn_closers", "load_session", "load_session_bytes",
        "pack_chunk_runs", "project_key", "request_digest", "sha256_jcs", "snapshot",
    ])
    for name in dsh_core.__all__:
        assert hasattr(dsh_core, name), name


def test_storage_exports():
    for name in dsh_core.storage.__all__:
        assert hasattr(dsh_core.storage, name), name


def test_error_tree_and_categories():
    assert issubclass(dsh_core.SurfaceError, dsh_core.ValidationError)
    assert issubclass(dsh_core.ValidationError, dsh_core.DshError)
    assert dsh_core.CorruptionError("x").category == "corrupt-storage"
    assert dsh_core.FormatUnsupportedError("x").category == "unsupported-format"
    assert dsh_core.SurfaceError("x").category == "invalid-log"
    assert dsh_core.PipelineError("x", retriable=True).retriable
    assert str(dsh_core.SequenceGapError("s", 3, 5, "dsh.session-events[2]@17")) == (
        "session 's': expected seq 3, got 5 at dsh.session-events[2]@17")

