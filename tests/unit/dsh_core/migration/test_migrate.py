"""``dsh-pipeline migrate``: a v0 or v3 log rewritten as v4 beside it, never replacing anything."""

from __future__ import annotations

import shutil
from pathlib import Path

from dsh_core.inspect import inspect_path
from dsh_pipeline.cli import main
from tests.conftest import canonical

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


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
    assert main(["migrate", str(folder), str(folder / "session.v3.jsonl.zstd")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("session.v4.jsonl.zstd: a v4 log is current already; nothing to migrate")  # the folder's
    assert err[1].endswith("already exists; migrate never replaces a log")  # the v3 file named
    assert (folder / "session.v4.jsonl.zstd").read_bytes() == b"theirs"
    assert sorted(path.name for path in folder.iterdir()) == ["session.v3.jsonl.zstd", "session.v4.jsonl.zstd"]


def test_a_v0_log_of_dsh_0_1_2_is_migrated_and_keeps_its_requests(tmp_path, capsys):
    folder = tmp_path / "session-tools-1"
    folder.mkdir()
    shutil.copyfile(FIXTURES / "dsh-0.1.2" / "session-tools-1.jsonl.zstd", folder / "session.jsonl.zstd")
    before = (folder / "session.jsonl.zstd").read_bytes()
    assert main(["migrate", str(folder)]) == 0
    v0, v4 = (inspect_path(folder / name).to_json() for name in ("session.jsonl.zstd", "session.v4.jsonl.zstd"))
    assert v4["accepted"] and v4["sessionHeader"]["version"] == 4
    assert len(v4["requests"]) == len(v0["requests"]) == 2
    tool_role = ["tool" if m["content"][0]["type"] == "tool-result" else m["role"] for m in v0["derivedMessages"]]
    assert [m["role"] for m in v4["derivedMessages"]] == ["system", *tool_role]  # prompt on the surface, tool role
    assert (folder / "session.jsonl.zstd").read_bytes() == before


def test_what_cannot_be_migrated_is_named(tmp_path, capsys):
    other = tmp_path / "notes.jsonl"
    other.write_bytes(b'{"type":"session"}\n')
    broken = _session(tmp_path, "plain") / "session.v3.jsonl.zstd"
    broken.write_bytes(b"\x28\xb5\x2f\xfd garbage")  # a zstd magic, then no frame
    assert main(["migrate", str(other), str(broken)]) == 1
    err = capsys.readouterr().err
    assert "migrate takes a v0 or v3 log in dsh's layout" in err and "FormatUnsupportedError" in err
    assert "CorruptionError" in err and str(broken) in err
    assert [path.name for path in broken.parent.iterdir()] == ["session.v3.jsonl.zstd"]  # no staged *.tmp left
    assert not list(tmp_path.glob("*.tmp"))
