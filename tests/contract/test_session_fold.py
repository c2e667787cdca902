"""The fold contract, run once per entry of :data:`dsh_core.formats.FORMATS`.

Every format's fold is fed, read, saved and restored the same way
(:class:`dsh_core.formats.SessionFold`); this suite holds each entry to it
on the real logs of that format under ``tests/fixtures`` (a log counts for
the format its header names). A new format in the registry is tested here
without a line added, and fails here until a release's real logs of it are
among the fixtures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DecodeError, DshError
from dsh_core.fold_snapshot import restore_fold, snapshot_fold
from dsh_core.formats import FORMATS, Format, SessionFold, format_for, format_of, header_version, open_fold, read_header
from dsh_core.jsonvalue import decode_json, encode_json
from dsh_core.loader import load_session
from dsh_core.storage.framing import frame_pieces, iter_frames
from dsh_core.storage.layout import generation_of
from dsh_core.storage.reader import header_line_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: At most this many logs of each format (the longest ones: they pass through the most states).
PER_FORMAT = 3


def _version_of(path: Path) -> object:
    try:
        return header_version(decode_json(header_line_of(path)))
    except DshError:
        return None


def _samples(version: int) -> list[Path]:
    """The accepted fixture logs of a format, longest first."""
    logs = [path for path in FIXTURES.glob("dsh-*/*.jsonl.zstd")
            if _version_of(path) == version and load_session(path).accepted]
    return sorted(logs, key=lambda path: -path.stat().st_size)[:PER_FORMAT]


def _lines(path: Path) -> list[bytes]:
    with open(path, "rb") as stream:
        text = b"".join(piece for frame in iter_frames(stream, str(path))
                        for piece in frame_pieces(stream, frame, str(path)))
    return text.split(b"\n")[:-1]


def _outcome(fold: SessionFold, analysis: LogAnalysis) -> tuple[object, ...]:
    state = fold.state
    return (fold.count, fold.event_count, encode_json(state.messages()), encode_json(state.header),
            encode_json(state.context), sorted(state.surface_events()), analysis.turns, analysis.request_count,
            fold.idle, fold.error)


@pytest.fixture(params=sorted(FORMATS), ids=lambda version: f"v{version}")
def log_format(request: pytest.FixtureRequest) -> Format:
    return FORMATS[request.param]


@pytest.fixture
def samples(log_format: Format) -> list[Path]:
    logs = _samples(log_format.version)
    assert logs, (f"format v{log_format.version} has no accepted log under {FIXTURES}: add a release's real logs "
                  "of it (with dsh's own reading of them) before listing it in FORMATS")
    return logs


def test_the_entry_describes_its_format(log_format: Format) -> None:
    assert FORMATS[log_format.version] is log_format is format_for(log_format.version)
    assert generation_of(log_format.file_name) == log_format.version
    assert log_format.name == f"v{log_format.version}"
    assert log_format.wire in (None, "chat-completions", "messages")
    assert sum(entry.current for entry in FORMATS.values()) == 1, "exactly one format is the one dsh writes today"


def test_the_header_opens_a_fold_of_the_format(log_format: Format, samples: list[Path]) -> None:
    for path in samples:
        lines = _lines(path)
        fold = open_fold(lines[0], str(path))
        assert fold.format_version == log_format.version and format_of(fold) is log_format
        assert fold.header == read_header(lines[0], str(path)) == log_format.read_header(decode_json(lines[0]), "x")
        assert fold.count == 0 and fold.error is None and fold.idle


def test_a_file_and_a_consumer_fold_alike(log_format: Format, samples: list[Path]) -> None:
    """``event_line`` (a file's lines) and ``apply`` (a consumer's records)
    end in the same state, which is the loader's."""
    for path in samples:
        lines = _lines(path)
        by_file, by_record = LogAnalysis(keep_requests=False), LogAnalysis(keep_requests=False)
        read, fed = open_fold(lines[0], "s", by_file), open_fold(lines[0], "s", by_record)
        for line in lines[1:]:
            assert read.event_line(line)
            fed.apply(line)
        assert _outcome(read, by_file) == _outcome(fed, by_record)
        closers = fed.finish()
        loaded = load_session(path)
        assert loaded.accepted and loaded.closers == closers
        assert loaded.event_count == fed.event_count + len(closers) and loaded.stored_count == fed.count


def test_a_fold_saved_and_restored_midway_ends_as_one_never_saved(log_format: Format, samples: list[Path]) -> None:
    for path in samples:
        lines = _lines(path)
        whole_analysis = LogAnalysis(keep_requests=False)
        whole = open_fold(lines[0], "s", whole_analysis)
        for line in lines[1:]:
            whole.apply(line)
        for cut in sorted({1, len(lines) // 3, len(lines) // 2, len(lines) - 1}):
            fold = open_fold(lines[0], "s", LogAnalysis(keep_requests=False))
            for line in lines[1:cut]:
                fold.apply(line)
            blob = snapshot_fold(fold)
            assert b"dsh_core" not in blob, "a snapshot names no module"
            analysis = LogAnalysis(keep_requests=False)
            restored = restore_fold(blob, "s", analysis)
            assert format_of(restored) is log_format and snapshot_fold(restored) == blob
            for line in lines[cut:]:
                restored.apply(line)
            assert _outcome(restored, analysis) == _outcome(whole, whole_analysis), f"{path.name} cut at {cut}"
            assert snapshot_fold(restored) == snapshot_fold(whole)


def test_a_snapshot_without_surface_events_takes_them_back(log_format: Format, samples: list[Path]) -> None:
    for path in samples:
        lines = _lines(path)
        fold = open_fold(lines[0], "s")
        for line in lines[1:]:
            fold.apply(line)
        rows = [(seq, kind, data) for seq, (kind, data) in fold.state.surface_events().items()]
        restored = restore_fold(snapshot_fold(fold, with_surface_events=False), "s", None, rows)
        assert snapshot_fold(restored) == snapshot_fold(fold)
        assert encode_json(restored.state.messages()) == encode_json(fold.state.messages())


def test_the_saved_state_is_the_formats_own(log_format: Format, samples: list[Path]) -> None:
    lines = _lines(samples[0])
    fold = open_fold(lines[0], "s")
    for line in lines[1:]:
        fold.apply(line)
    state = log_format.save(fold, True)
    assert type(state) is log_format.state_type
    again = log_format.restore(state, "s", None, None)
    assert log_format.save(again, True) == state


def test_a_record_that_is_no_record_refuses_the_record_not_the_log(log_format: Format, samples: list[Path]) -> None:
    lines = _lines(samples[0])
    fold = open_fold(lines[0], "session 's'")
    fold.apply(lines[1])
    with pytest.raises(DecodeError):  # v3/v4 name the session and seq; v0 leaves that to its caller
        fold.apply(b"{not json")
    assert fold.count == 1 and fold.error is None
    for line in lines[2:]:
        fold.apply(line)
    assert fold.error is None
    fold.finish()
