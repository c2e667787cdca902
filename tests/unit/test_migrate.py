"""``dsh-pipeline migrate``: a v3 log rewritten as v4 beside it, never replacing anything."""

from __future__ import annotations

import shutil
from pathlib import Path

from dsh_core.inspect import inspect_path
from dsh_pipeline.cli import main
from tests.conftest import canonical

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _session(tmp_path: Path, name: str = "tools") -> Path:
    folder = tmp_path / f"session-{name}"
    folder.mkdir()
    shutil.copyfile(FIXTURES / "dsh-0.1.5" / f"{name}.v3.jsonl.zstd", folder / "session.v3.jsonl.zstd")
    return folder


def test_the_v4_log_derives_what_the_v3_log_does_and_the_source_stays(tmp_path, capsys):
    folder = _session(tmp_path)
    before = (folder / "session.v3.jsonl.zstd").read_bytes()
    assert main(["migrate", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "session.v4.jsonl.zstd")
    v3, v4 = (inspect_path(folder / name).to_json() for name in ("session.v3.jsonl.zstd", "session.v4.jsonl.zstd"))
    assert v4["accepted"] and v4["sessionHeader"]["version"] == 4
    for key in ("eventCount", "surfaceNodes", "derivedMessages", "requestHeader", "requests"):
        assert canonical(v4[key]) == canonical(v3[key]), key
    assert (folder / "session.v3.jsonl.zstd").read_bytes() == before


def test_an_existing_v4_log_is_never_replaced(tmp_path, capsys):
    folder = _session(tmp_path)
    (folder / "session.v4.jsonl.zstd").write_bytes(b"theirs")
    assert main(["migrate", str(folder)]) == 1
    assert "already exists; migrate never replaces a log" in capsys.readouterr().err
    assert (folder / "session.v4.jsonl.zstd").read_bytes() == b"theirs"
    assert sorted(path.name for path in folder.iterdir()) == ["session.v3.jsonl.zstd", "session.v4.jsonl.zstd"]


def test_what_cannot_be_migrated_is_named(tmp_path, capsys):
    v0 = tmp_path / "session.jsonl.zstd"
    shutil.copyfile(FIXTURES / "dsh-0.1.2" / "session-plain-0.jsonl.zstd", v0)
    broken = _session(tmp_path, "plain") / "session.v3.jsonl.zstd"
    broken.write_bytes(b"\x28\xb5\x2f\xfd garbage")  # a zstd magic, then no frame
    assert main(["migrate", str(v0), str(broken)]) == 1
    err = capsys.readouterr().err
    assert "migrate takes a v3 log" in err and "FormatUnsupportedError" in err
    assert "CorruptionError" in err and str(broken) in err
    assert not (broken.parent / "session.v4.jsonl.zstd").exists()
