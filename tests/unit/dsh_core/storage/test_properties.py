"""Property tests: storage round trips are exact; mutations get the right error."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core.errors import (
    CorruptionError,
    EnvelopeError,
    FormatUnsupportedError,
    MessageShapeError,
    RequestHeaderError,
    SurfaceError,
)
from dsh_core.events import KNOWN_TYPES, ROW_TAGS
from dsh_core.jsonvalue import _write, canonical_json, decode_json, encode_json, thaw
from dsh_core.session import SessionLog
from dsh_core.session_header import SessionHeader
from dsh_core.storage.framing import compress_frame
from dsh_core.loader import load_session_bytes
from dsh_core.storage.records import decode_row, encode_records
from tests.conftest import canonical
from tests.strategies import mutated_logs, session_logs

HEADER = SessionHeader(id="prop-session", createdAt=0, delegationDepth=0).to_line() + b"\n"
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_lines(text: bytes) -> list[dict]:
    events = []
    for line in text.splitlines():
        value = decode_json(line)
        events.extend(decode_row(value).expand() if value["type"] in ROW_TAGS else [value])
    return events


@PROPS
@given(session_logs())
def test_event_record_line_round_trip(events):
    text = encode_records(events)
    assert canonical(_decode_lines(text)) == canonical(events)
    for line in text.splitlines():  # line ⇄ value is byte-exact
        assert encode_json(decode_json(line)) == line


@PROPS
@given(session_logs(), st.lists(st.integers(1, 40), min_size=1, max_size=8), st.booleans())
def test_batches_to_zstd_frames_and_back(events, cuts, zstd):
    batches, rest = [], list(events)
    for cut in cuts:
        if rest:
            batches.append(rest[:cut])
            rest = rest[cut:]
    if rest:
        batches.append(rest)
    if zstd:
        data = compress_frame(HEADER) + b"".join(compress_frame(encode_records(b)) for b in batches)
    else:
        data = HEADER + b"".join(encode_records(b) for b in batches)
    result = load_session_bytes(data, compression="zstd" if zstd else "none")
    assert result.accepted, result.error
    assert result.stored_count == len(events) and result.closers == []
    log = SessionLog("prop-session", copy.deepcopy(events), clock=lambda: 0)
    assert canonical(thaw(result.state.messages())) == canonical(thaw(log.derive_messages()))
    assert list(result.state.surface.nodes) == list(log.surface_nodes)


EXPECTED = {
    "extra-key": EnvelopeError, "time-fraction": EnvelopeError, "ignorable-false": EnvelopeError,
    "surfaceop-missing": SurfaceError, "surfaceop-bad": SurfaceError, "sources-later": SurfaceError,
    "sources-empty": SurfaceError, "replace-sources-missing": SurfaceError, "replace-extra": SurfaceError,
    "surfaceop-on-non-surface": SurfaceError, "message-id-empty": MessageShapeError,
    "header-no-model": RequestHeaderError, "header-fallback": RequestHeaderError,
}


@PROPS
@given(mutated_logs())
def test_mutations_are_refused_with_the_right_error(case):
    name, events = case
    kind = name.split("@")[0]
    result = load_session_bytes(HEADER + encode_records(events))
    if kind == "seq-shift":  # a reader defect: corrupt before a later turn/end, else a dropped crash tail
        assert isinstance(result.error, CorruptionError) or (result.accepted and result.dropped_bytes > 0)
    elif kind == "replace-start-zero":  # node 0 may be the range start already
        assert result.accepted or isinstance(result.error, SurfaceError)
    elif kind == "ignorable-false" and events[int(name.split("@")[1])]["type"] not in KNOWN_TYPES:
        # an unknown type without ignorable:true is refused (stage 4) before
        # the envelope is validated (stage 6)
        assert isinstance(result.error, FormatUnsupportedError), (name, result.error)
    elif kind == "sources-empty" and result.accepted:
        assert all(e["type"] == "assistant/message" for e in events if e.get("sourceEventSeqs") == [])
    else:
        assert isinstance(result.error, EXPECTED[kind]), (name, result.error)


_json_leaves = (st.none() | st.booleans() | st.integers(min_value=-(2**60), max_value=2**60)
                | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or str(f) == "0.0")
                | st.integers(min_value=-999, max_value=999).map(float)
                | st.sampled_from([1e21, 1e-7, 2.5e300, 123456789012345678.0])
                | st.text(alphabet="0123456789e.-,]}:{\"\\abc\U0001f600\u20ac", max_size=12))
_json_keys = st.text(alphabet="0123456789ab\U0001f600\ufb33", max_size=4)
_json_values = st.recursive(_json_leaves, lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(_json_keys, inner, max_size=4), max_leaves=12)


@PROPS
@given(_json_values)
def test_fast_encoders_agree_with_the_exact_writer(value):
    # msgspec's bytes are taken only where they equal JSON.stringify's / JCS's
    for encoder, canonical_form in ((encode_json, False), (canonical_json, True)):
        out: list[str] = []
        _write(value, out, canonical=canonical_form)
        assert encoder(value) == "".join(out).encode("utf-8", "surrogatepass")
