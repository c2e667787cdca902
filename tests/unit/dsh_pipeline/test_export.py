"""``dsh-pipeline export``: the sessions and messages of a view store as JSON
Lines and Parquet, the same rows in both, selected as ``sessions`` selects,
written owner-only and whole or not at all."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from consumers.projector.reader import SessionFilter
from consumers.projector.store_reader import StoreReader
from dsh_pipeline.cli import main
from tests.view_store_helpers import stored_fleet


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    location = tmp_path_factory.mktemp("export") / "views.sqlite"
    stored_fleet(location)
    return location


def _export(store, out, *flags: str) -> int:
    return main(["export", "--store", str(store), "--out", str(out), *flags])


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def test_sessions_and_messages_are_the_stores_in_both_formats(store, tmp_path):
    reader = StoreReader(store)
    try:
        listed = reader.sessions(SessionFilter(), limit=200)["items"]
        views = {item["sessionId"]: reader.session(item["sessionId"]) for item in listed}
    finally:
        reader.close()
    for table in ("sessions", "messages"):
        assert _export(store, tmp_path / f"{table}.jsonl", "--table", table) == 0
        assert _export(store, tmp_path / f"{table}.parquet", "--table", table, "--format", "parquet") == 0
        assert _jsonl(tmp_path / f"{table}.jsonl") == pq.read_table(tmp_path / f"{table}.parquet").to_pylist()
        assert (tmp_path / f"{table}.jsonl").stat().st_mode & 0o777 == 0o600
    sessions = _jsonl(tmp_path / "sessions.jsonl")
    assert [row["sessionId"] for row in sessions] == [item["sessionId"] for item in listed]
    for row, item in zip(sessions, listed):
        assert row["inputTokens"] == sum(model["inputTokens"] for model in item["models"])
        assert (row["status"], row["messageCount"]) == (item["status"], item["messageCount"])
    messages = _jsonl(tmp_path / "messages.jsonl")
    expected = [(session_id, message["id"], message["content"]) for session_id in views
                for message in views[session_id]["messages"]]
    assert [(row["sessionId"], row["messageId"], json.loads(row["content"])) for row in messages] == expected
    assert all(row["seq"] == views[row["sessionId"]]["messageSeqs"][row["messageId"]] for row in messages)


def test_sessions_are_selected_as_the_sessions_command_selects_them(store, tmp_path):
    assert _export(store, tmp_path / "held.jsonl", "--status", "held") == 0
    held = _jsonl(tmp_path / "held.jsonl")
    assert [row["status"] for row in held] == ["held"]
    assert _export(store, tmp_path / "idle.jsonl", "--status", "idle") == 0
    chosen = max(_jsonl(tmp_path / "idle.jsonl"), key=lambda row: row["messageCount"])
    assert _export(store, tmp_path / "one.jsonl", "--table", "messages", "--session", chosen["sessionId"][:16]) == 0
    rows = _jsonl(tmp_path / "one.jsonl")
    assert len(rows) == chosen["messageCount"] > 0 and {row["sessionId"] for row in rows} == {chosen["sessionId"]}


def test_an_existing_file_is_kept_unless_forced_and_a_failed_export_leaves_nothing(store, tmp_path, capsys):
    out = tmp_path / "sessions.jsonl"
    out.write_text("mine\n")
    assert _export(store, out) == 1
    assert "--out " + str(out) + ": exists; give --force to replace it" in capsys.readouterr().err
    assert out.read_text() == "mine\n"
    assert _export(store, out, "--force") == 0 and len(_jsonl(out)) == 6
    nowhere = tmp_path / "no-such-folder" / "x.parquet"
    assert _export(store, nowhere, "--format", "parquet") == 1
    assert f"--out {nowhere}: cannot be written" in capsys.readouterr().err
    assert not nowhere.parent.exists()


def test_text_utf8_cannot_hold_is_written_as_json_escapes(tmp_path):
    from dsh_pipeline.export_command import _json_text, _text
    value = {"text": "a\ud800b", "ok": "é"}
    assert json.loads(_json_text(value)) == value
    _json_text(value).encode("utf-8")
    assert _text("x\udfffy") == "x\\udfffy" and _text("é") == "é" and _text(None) is None


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_planted_staging_name_neither_redirects_nor_exposes_the_export(store, tmp_path, fmt):
    """Another user who can write the folder plants the name the staged file
    once had: a symlink to a file of the exporting user's, or a file of its
    own that others may read. The export touches neither; its file is the
    exporting user's, owner-only."""
    victim = tmp_path / "victim"
    victim.write_text("the user's own file\n")
    out = tmp_path / f"sessions.{fmt}"
    (tmp_path / f".{out.name}.partial").symlink_to(victim)
    assert _export(store, out, "--format", fmt) == 0
    assert victim.read_text() == "the user's own file\n" and not out.is_symlink()
    planted = tmp_path / f"other.{fmt}"
    trap = tmp_path / f".{planted.name}.partial"
    trap.write_text("")
    trap.chmod(0o666)
    assert _export(store, planted, "--format", fmt) == 0
    assert planted.stat().st_mode & 0o777 == 0o600
    assert trap.read_text() == ""  # the planted file stays as it was, and nothing staged is left
    assert {path.name for path in tmp_path.iterdir() if path.name.startswith(".")} == {
        f".{out.name}.partial", trap.name}


def test_an_out_that_appears_while_exporting_is_not_replaced_without_force(store, tmp_path, monkeypatch, capsys):
    import dsh_pipeline.export_command as export_command
    out = tmp_path / "sessions.jsonl"
    writing = export_command._write_jsonl

    def racing(path, table, rows, force):  # the file shows up after the check, while rows are written
        out.write_text("someone else's\n")
        return writing(path, table, rows, force)

    monkeypatch.setattr(export_command, "_write_jsonl", racing)
    monkeypatch.setattr(export_command, "_writer", lambda kind: racing)
    assert _export(store, out) == 1
    assert out.read_text() == "someone else's\n"
    assert f"--out {out}: exists; give --force to replace it" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["sessions.jsonl"]
