"""The simulator's sessions are logs dsh 0.2.1rc2's own reader accepts (v3
and v4: deriving what we derive; v0: through dsh's migration): a simulated
fleet tests the pipeline with sessions a real dsh would open, not with what
only our reader takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.storage.framing import compress_frame
from dsh_core.storage.layout import log_path
from dsh_kafka.records import KIND_HEADER, KIND_RECORD
from producers.simulator import SimulatorConfig, messages_digest, simulate_session
from tests.conftest import canonical
from tests.oracle import run_oracle

SESSIONS = 16  # per format


def _write(root: Path, version: int) -> dict[str, tuple[Path, str]]:
    """Each simulated session as dsh stores it (a header frame, then a frame
    per append batch); its path and the simulator's digest of its messages."""
    config = SimulatorConfig(sessions=SESSIONS, seed=21, max_turns=4, formats=(version,))
    written = {}
    for index in range(config.sessions):
        truth, batches = simulate_session(config, index)
        records = [[r for r in batch if r.kind in (KIND_HEADER, KIND_RECORD)] for batch in batches]
        [header] = [r for batch in records for r in batch if r.kind == KIND_HEADER]
        frames = [compress_frame(header.value + b"\n")]
        frames += [compress_frame(b"".join(r.value + b"\n" for r in batch if r.kind == KIND_RECORD))
                   for batch in records if any(r.kind == KIND_RECORD for r in batch)]
        path = log_path(root, json.loads(header.value)["cwd"], truth.session_id, "zstd", version)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"".join(frames))
        written[truth.session_id] = (path, truth.messages_digest)
    return written


def test_simulated_v0_sessions_are_logs_dsh_0_2_1_migrates(oracle, tmp_path):
    """dsh 0.2.1 reads v0 only through its v0→v4 migration, which checks
    shapes 0.1.x's reader let pass (0.1.2's compaction and retry records):
    every simulated v0 session must get through it."""
    written = _write(tmp_path, 0)
    theirs = run_oracle(tmp_path)
    assert sorted(theirs) == sorted(written)
    for session_id, (path, digest) in written.items():
        assert theirs[session_id]["ok"], (session_id, theirs[session_id].get("message"))
        ours = inspect_path(path).to_json()
        assert ours["accepted"] and messages_digest(ours["derivedMessages"]) == digest, session_id


@pytest.mark.parametrize("version", [3, 4])
def test_simulated_sessions_are_accepted_by_dsh_and_derive_what_dsh_derives(oracle, tmp_path, version):
    written = _write(tmp_path, version)
    theirs = run_oracle(tmp_path)
    assert sorted(theirs) == sorted(written)
    for session_id, (path, digest) in written.items():
        reading, ours = theirs[session_id], inspect_path(path).to_json()
        assert reading["ok"], (session_id, reading.get("message"))
        assert ours["accepted"], (session_id, ours["error"])
        assert ours["eventCount"] == len(reading["events"]), session_id
        assert ours["surfaceNodes"] == reading["surface"]["nodes"], session_id
        assert canonical(ours["derivedMessages"]) == canonical(reading["messages"]), session_id
        assert messages_digest(reading["messages"]) == digest, session_id
