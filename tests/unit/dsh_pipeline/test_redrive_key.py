"""The redrive command's key: named when missing, refused when others may
read it or it is short, before the store or the cluster is asked anything."""

from __future__ import annotations

import pytest

from dsh_pipeline.cli import main


@pytest.fixture
def redrive_key_file(tmp_path, monkeypatch):
    path = tmp_path / "redrive.key"
    path.touch(0o600)
    path.write_text("k" * 64 + "\n")
    monkeypatch.setenv("DSH_REDRIVE_KEY_FILE", str(path))
    return path


def test_redrive_without_the_key_is_refused_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DSH_REDRIVE_KEY_FILE", raising=False)
    assert main(["dead-letters", "--redrive", "--store", str(tmp_path / "views.sqlite"),
                 "--bootstrap", "unused.invalid:9092"]) != 0
    assert "$DSH_REDRIVE_KEY_FILE is not set" in capsys.readouterr().err


def test_a_redrive_key_others_may_read_or_too_short_is_refused(redrive_key_file, tmp_path, capsys):
    redrive_key_file.chmod(0o644)
    assert main(["dead-letters", "--redrive", "--store", str(tmp_path / "views.sqlite")]) != 0
    assert "its group or others may read or change it" in capsys.readouterr().err
    redrive_key_file.chmod(0o600)
    redrive_key_file.write_text("short\n")
    assert main(["dead-letters", "--redrive", "--store", str(tmp_path / "views.sqlite")]) != 0
    assert "the redrive key has 5 characters, fewer than 32" in capsys.readouterr().err
