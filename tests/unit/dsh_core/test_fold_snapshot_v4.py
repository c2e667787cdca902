"""v3/v4 folds fed record by record, as consumers feed them, and saved and
restored midway, end exactly like the file's load; the state the snapshot
covers is pinned, it names no module or class, and the pickles of earlier
layouts still restore, through an unpickler that builds nothing foreign."""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import pytest

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DecodeError, FormatUnsupportedError
from dsh_core.fold_snapshot import V4_SNAPSHOT_LAYOUT, V4_SNAPSHOT_MAGIC, restore_fold, snapshot_fold
from dsh_core.formats import open_fold
from dsh_core.jsonvalue import FrozenDict, encode_json
from dsh_core.session_header import SessionHeader
from dsh_core.storage.framing import frame_pieces, iter_frames
from dsh_core.loader import load_session
from dsh_core.formats.v0.repair import OpenTurnTracker
from dsh_core.formats.v3 import V3Fold
from dsh_core.formats.v3.pickled import MOVED_NAMES
from dsh_core.formats.v4 import V4Fold
from dsh_core.formats.v4.lifecycle import Relationships
from dsh_core.formats.v4.lookback import ToolsBySeq
from dsh_core.formats.v4.session import V4State

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOGS = sorted([*FIXTURES.glob("dsh-0.1.5/*.v3.jsonl.zstd"), *FIXTURES.glob("dsh-0.2.1/*.v4.jsonl.zstd")])


def stored_lines(path: Path) -> list[bytes]:
    with open(path, "rb") as stream:
        text = b"".join(piece for frame in iter_frames(stream, str(path)) for piece in frame_pieces(stream, frame, str(path)))
    return text.split(b"\n")[:-1]


def _outcome(fold, analysis: LogAnalysis) -> tuple:
    state = fold.state
    return (fold.count, encode_json(state.messages()), list(state.surface.nodes), state.surface.replace_generation,
            encode_json(state.header), encode_json(state.context), analysis.turns, analysis.request_count,
            dict(analysis.usage), fold.idle)


@pytest.mark.parametrize("log", LOGS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_fold_saved_at_every_record_ends_as_the_load(log):
    reference = LogAnalysis(keep_requests=False)
    whole = load_session(log, observer=reference)
    assert whole.accepted, whole.error
    lines = stored_lines(log)
    analysis = LogAnalysis(keep_requests=False)
    fold = open_fold(lines[0], "restored", analysis)
    for index, line in enumerate(lines[1:]):
        analysis = LogAnalysis(keep_requests=False)
        rows = [(seq, *row) for seq, row in fold.state.surface_events().items()]
        fold = restore_fold(snapshot_fold(fold, with_surface_events=index % 2 == 0), "restored", analysis, rows)
        fold.apply(line)
        assert fold.error is None, fold.error
    fold.finish()
    assert fold.count == whole.stored_count
    assert _outcome(fold, analysis) == _outcome(_Loaded(whole), reference)


class _Loaded:
    """A load result read as a fold (every fixture ends its last turn: idle)."""

    def __init__(self, result) -> None:
        self.count, self.state, self.idle = result.stored_count, result.state, True


def test_a_refusal_found_record_by_record_is_the_loads():
    log = FIXTURES / "dsh-0.2.1" / "tools.v4.jsonl.zstd"
    lines = stored_lines(log)
    bad = lines[4].replace(b'"type":"', b'"type":"x-unknown/', 1)
    fold = open_fold(lines[0], "session 'tools'")
    for line in [*lines[1:4], bad]:
        fold.apply(line)
    assert isinstance(fold.error, FormatUnsupportedError)
    assert "unknown to this harness" in fold.error.message and "seq 3" in fold.error.message


def test_a_record_that_is_no_row_refuses_the_record_not_the_session():
    lines = stored_lines(FIXTURES / "dsh-0.2.1" / "plain.v4.jsonl.zstd")
    fold = open_fold(lines[0], "session 'plain'")
    with pytest.raises(DecodeError, match=r"session 'plain': seq 0"):
        fold.apply(b"{not json")
    fold.apply(lines[1])
    assert fold.count == 1 and fold.error is None


def _attributes(value, seen=None) -> dict[str, list[str]]:
    """Class name -> the attributes its instances save, over a fold's object graph."""
    seen = {} if seen is None else seen
    if isinstance(value, dict):  # a surface event's data: JSON, nothing of ours
        for item in [*value.keys(), *value.values()]:
            _attributes(item, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _attributes(item, seen)
    elif type(value).__module__.startswith("dsh_core.") and not isinstance(value, Exception):
        names = sorted(getattr(value, "__dict__", {}) or
                       [name for cls in type(value).__mro__ for name in getattr(cls, "__slots__", ())])
        seen[type(value).__qualname__] = names
        for name in names:
            _attributes(getattr(value, name), seen)
    return seen


#: The attributes the Structs of dsh_core.formats.v4.snapshot save (layout 3). A new one here is a new field there (with a
#: default, so older snapshots still read); any other change is a new layout: bump V4_SNAPSHOT_LAYOUT.
SAVED = {
    # children: a migration's (load_session's), catalogued at its end; a consumer's fold has none to save
    "V3Fold": ["_foreign_delivery", "_issue", "_line_no", "_mapping", "_next_turn_spliced", "_refusal",
               "_step_open", "_turn", "children", "count", "events", "v4", "where"],
    "V4Fold": ["_admission_error", "_adoption_error", "_artifact_error", "_fold_error", "_foreign_delivery",
               "_inherited", "_issue", "_line_no", "_local_error", "_relationships", "_vocabulary_error", "count",
               "folder", "header", "migrated", "observer", "state", "where"],
    "Relationships": ["_completed", "_crossing", "_cut_off", "_held", "_open_start", "commands", "compaction",
                      "dispatches", "error", "header_tools", "next_step", "next_turn", "protected_head", "provider",
                      "retries", "started_retries", "step", "surface", "tools", "turn", "types", "user_kinds"],
    "ToolsBySeq": ["_by_seq", "_distinct"],
    "SessionHeader": ["agentPreset", "createdAt", "cwd", "delegationDepth", "id", "isSeeded", "origin",
                      "parentSession", "seedLength", "version"],
    "V4State": ["_events", "_header_tools", "_projected", "context", "header", "last_time", "next_seq", "session_id",
                "surface"],
    "_Surface": ["nodes", "replace_generation"],
    "_Compaction": ["command", "id", "seq", "summarized", "turn"],
    "_Marker": ["name"],  # saved as what it means: an omitted field (ABSENT), a list of seqs (NO_SOURCE)
}


def test_the_saved_layout_is_pinned():
    lines = stored_lines(FIXTURES / "dsh-0.1.5" / "compact.v3.jsonl.zstd")
    fold = open_fold(lines[0], "session")
    layout: dict[str, list[str]] = {}
    for line in lines[1:]:  # every state the fold passes through (a compaction is open only midway)
        fold.apply(line)
        _attributes(fold, layout)
    assert V4_SNAPSHOT_LAYOUT == 3
    assert layout == SAVED


def test_snapshots_of_another_layout_or_foreign_classes_are_refused():
    lines = stored_lines(FIXTURES / "dsh-0.2.1" / "plain.v4.jsonl.zstd")
    fold = open_fold(lines[0], "session")
    blob = snapshot_fold(fold)
    newer = blob.replace(V4_SNAPSHOT_MAGIC % V4_SNAPSHOT_LAYOUT, V4_SNAPSHOT_MAGIC % (V4_SNAPSHOT_LAYOUT + 1), 1)
    with pytest.raises(FormatUnsupportedError, match=r"^session 's': fold snapshot is 'dsh-pipeline v4 fold snapshot, "
                                                     r"layout 4', but this build reads only layouts 1, 2, 3$"):
        restore_fold(newer, "session 's'", None)
    for foreign in (pickle.dumps(Path("/etc/passwd")), pickle.dumps(OpenTurnTracker())):  # ours, but no fold's
        with pytest.raises(DecodeError, match=r"^session 's': not a fold snapshot: UnpicklingError: .* is not part "
                                              r"of a fold$"):
            restore_fold(V4_SNAPSHOT_MAGIC % 2 + foreign, "session 's'", None)
    with pytest.raises(DecodeError, match=r"^session 's': not a fold snapshot: it holds a FrozenDict"):
        restore_fold(V4_SNAPSHOT_MAGIC % 2 + pickle.dumps(FrozenDict()), "session 's'", None)


def test_a_malformed_snapshot_is_named_with_its_session():
    lines = stored_lines(FIXTURES / "dsh-0.2.1" / "plain.v4.jsonl.zstd")
    fold = open_fold(lines[0], "session")
    blob = snapshot_fold(fold)
    with pytest.raises(DecodeError, match=r"^session 's': not a fold snapshot: "):
        restore_fold(blob[:-7], "session 's'", None)
    with pytest.raises(DecodeError, match=r"^session 's': not a fold snapshot: Object missing required field `count` - "
                                          r"at `\$.fold`$"):
        restore_fold(blob.replace(b'"count":', b'"counted":', 1), "session 's'", None)
    # a format no build lists (a later build's snapshot of a format this one does not read)
    with pytest.raises(DecodeError, match=r"^session 's': not a fold snapshot: Invalid value 'v999' - at `\$.fold.format`"):
        restore_fold(blob.replace(b'"format":"v4"', b'"format":"v999"', 1), "session 's'", None)
    fold.apply(lines[1].replace(b'"type":"', b'"type":"x-unknown/', 1))
    blob = snapshot_fold(fold)
    assert b'["FormatUnsupportedError",' in blob
    with pytest.raises(FormatUnsupportedError, match=r"^session 's': fold snapshot of layout 3: it keeps an error of "
                                                     r"unknown kind 'Renamed'$"):
        restore_fold(blob.replace(b'["FormatUnsupportedError",', b'["Renamed",', 1), "session 's'", None)
    fold = open_fold(lines[0], "session")
    for line in lines[1:]:
        fold.apply(line)
    blob = snapshot_fold(fold)
    toolset = blob.index(b'"by_seq":[[') + len(b'"by_seq":[[')
    bad = blob[:toolset] + blob[toolset:].replace(b",0]", b",7]", 1)
    with pytest.raises(DecodeError, match=r"^session 's': fold snapshot of layout 3: the request/header at seq \d+ "
                                          r"names toolset 7 of 1$"):
        restore_fold(bad, "session 's'", None)


def test_the_snapshot_names_no_module_or_class(monkeypatch):
    """Stored state outlives the code's layout: moving a fold's classes to
    other modules changes nothing a snapshot holds."""
    lines = stored_lines(FIXTURES / "dsh-0.1.5" / "compact.v3.jsonl.zstd")
    fold = open_fold(lines[0], "session", LogAnalysis(keep_requests=False))
    for line in lines[1:len(lines) // 2]:
        fold.apply(line)
    blob = snapshot_fold(fold)
    assert b"dsh_core" not in blob and b"V4Fold" not in blob and b"Relationships" not in blob
    for cls in (V3Fold, V4Fold, V4State, Relationships, ToolsBySeq, SessionHeader):
        monkeypatch.setattr(cls, "__module__", "dsh_core.formats.moved")
    assert snapshot_fold(fold) == blob
    restored = restore_fold(blob, "session", LogAnalysis(keep_requests=False))
    assert snapshot_fold(restored) == blob


def _pickled_as_written_then(value, monkeypatch) -> bytes:
    """``value`` pickled as a build of layouts 1 and 2 pickled it: each of its
    classes under the module and name :data:`MOVED_NAMES` lists (the
    modules those builds had, such as ``dsh_core.v4.load``)."""
    renamed = []
    for (module, name), moved in MOVED_NAMES.items():
        if not module.startswith("dsh_core."):
            continue
        if module not in sys.modules:
            monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
        monkeypatch.setattr(sys.modules[module], name, moved, raising=False)
        cls = moved if isinstance(moved, type) else type(moved)
        renamed.append((cls, cls.__module__, cls.__qualname__))
        cls.__module__ = module
        if isinstance(moved, type):
            cls.__qualname__ = name
    try:
        return pickle.dumps(value, protocol=5)
    finally:
        for cls, module, qualname in reversed(renamed):
            cls.__module__, cls.__qualname__ = module, qualname


def test_a_layout_1_snapshot_still_restores(monkeypatch):
    """Stores written before image offloads were read hold layout 1: a
    pickled v4 state without projected messages."""
    lines = stored_lines(FIXTURES / "dsh-0.2.1" / "tools.v4.jsonl.zstd")
    fold = open_fold(lines[0], "session")
    for line in lines[1:]:
        fold.apply(line)
    expected = fold.state.messages()
    del fold.state._projected  # what layout 1 saved
    blob = _pickled_as_written_then(fold, monkeypatch)
    monkeypatch.undo()
    assert b"dsh_core.v4.load" in blob and b"dsh_core.formats" not in blob
    restored = restore_fold(V4_SNAPSHOT_MAGIC % 1 + blob, "session 's'", None)
    assert restored.state.messages() == expected and restored.state._projected == {}
