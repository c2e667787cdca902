"""v0 as dsh 0.1.2 writes it: range-encoded ``sourceEventSeqs``, read as
dsh 0.1.2 reads them (``tests/fixtures/dsh-0.1.2/README.md``). That our
reading of 0.1.2's own logs is 0.1.2's is checked with every other release's
in ``tests/conformance/test_formats.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsh_core.errors import DecodeError
from dsh_core.storage.framing import frame_pieces, iter_frames
from dsh_core.loader import load_session_bytes
from dsh_core.storage.seq_ranges import MAX_SOURCE_SEQS, decode_source_seqs

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "dsh-0.1.2"
LOGS = sorted(FIXTURES.glob("*.jsonl.zstd"))


def test_the_fixtures_hold_what_0_1_2_writes():
    lines = b"".join(_plain_lines(log) for log in LOGS)
    assert b'"sourceEventSeqs":[[' in lines and b'"totalTokens":' in lines and b'"reason":"series"' in lines


def _plain_lines(log: Path) -> bytes:
    with open(log, "rb") as stream:
        return b"".join(piece for frame in iter_frames(stream, str(log)) for piece in frame_pieces(stream, frame, str(log)))


def _mutated(seq: int, sources: object) -> bytes:
    """``session-plain-0`` as plain JSONL, one event's ``sourceEventSeqs`` replaced."""
    lines = _plain_lines(FIXTURES / "session-plain-0.jsonl.zstd").split(b"\n")
    for index, line in enumerate(lines[1:], 1):
        event = json.loads(line) if line else None
        if event is not None and event.get("seq") == seq:
            lines[index] = json.dumps(event | {"sourceEventSeqs": sources}, separators=(",", ":")).encode()
    return b"\n".join(lines)


# (seq, sourceEventSeqs, dsh 0.1.2's verdict); its refusals name the category
# its reader uses: an unparsable line (corrupt-storage, under the torn-tail
# rules) or a session rule (invalid-log).
_MUTATIONS = [
    (43, [12, [13, 41], 42], None),
    (43, [[12, 13], [14, 14], [15, 42]], None),
    (43, [42] + list(range(12, 42)), None),  # plain and unsorted: as written by 0.1.1
    (43, [[]], "corrupt-storage"),
    (43, [42, [12, 41]], "corrupt-storage"),
    (43, [[[12, 42]]], "corrupt-storage"),
    (43, [[12, 30], [25, 42]], "corrupt-storage"),
    (43, [[12, 20], 20], "corrupt-storage"),
    (43, [[12.5, 42]], "corrupt-storage"),
    (43, [[-1, 42]], "corrupt-storage"),
    (43, [["12", 42]], "corrupt-storage"),
    (43, [[0, 100]], "corrupt-storage"),
    (43, [[42, 12]], "corrupt-storage"),
    (43, [[12, 42, 1]], "corrupt-storage"),
    (43, [[12, 43]], "invalid-log"),
    (43, [12, 12], "invalid-log"),
    (4, [[0, 3]], "invalid-log"),  # on turn/start: not a surface event
    (7, [], "invalid-log"),
]


@pytest.mark.parametrize(("seq", "sources", "category"), _MUTATIONS, ids=lambda value: json.dumps(value))
def test_mutated_sources_get_dsh_0_1_2_verdict(seq, sources, category):
    result = load_session_bytes(_mutated(seq, sources), "mutated", "none")
    assert (result.error.category if result.error else None) == category, result.error


def test_a_plain_list_keeps_the_rules_of_the_reader_before_ranges():
    # dsh 0.1.2 calls these unparsable lines; 0.1.0-0.1.1, whose logs carry the
    # same header, refuse them as invalid: without a range, the older rule holds.
    for sources in (["12"], 12, None):
        result = load_session_bytes(_mutated(43, sources), "mutated", "none")
        assert result.error.category == "invalid-log", sources


def test_a_malformed_range_in_the_tail_is_a_torn_record():
    lines = _mutated(43, [[42, 12]]).split(b"\n")
    tail = [line for line in lines if line and json.loads(line).get("type") != "turn/end"]
    result = load_session_bytes(b"\n".join(tail) + b"\n", "torn", "none")
    assert result.accepted and result.repaired, result.error


@pytest.mark.parametrize(("sources", "seq", "decoded"), [
    ([[12, 14]], 20, [12, 13, 14]),
    ([1, [3, 5], 9], 10, [1, 3, 4, 5, 9]),
    ([5, 1], 10, [5, 1]),  # no range: as stored
    (None, 3, None),
])
def test_decoding(sources, seq, decoded):
    assert decode_source_seqs(sources, seq) == decoded


def test_a_range_never_builds_more_entries_than_events_before_it_or_the_limit():
    with pytest.raises(DecodeError, match=r"range \[0, 9007199254740990\] exceeds its event sequence 5"):
        decode_source_seqs([[0, 2**53 - 2]], 5)
    assert len(decode_source_seqs([[0, MAX_SOURCE_SEQS - 1]], 3_000_000)) == MAX_SOURCE_SEQS
    with pytest.raises(DecodeError, match=f"stand for more than {MAX_SOURCE_SEQS} seqs"):
        decode_source_seqs([[0, 2_999_999]], 3_000_000)  # 15 bytes that would build 3 million entries
