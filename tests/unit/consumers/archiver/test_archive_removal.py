"""Removing a session's archive folder while another remover (the archiver
at the deletion fence, or delete-session --archive) is at it too."""

from __future__ import annotations

import shutil

from consumers.archiver.files import archive_segment, remove_session


def test_a_folder_the_other_remover_is_removing_is_removed_without_error(tmp_path, monkeypatch):
    folder = tmp_path / "project-a" / archive_segment("s-1")
    folder.mkdir(parents=True)
    (folder / "session.jsonl").write_text("{}\n")
    (tmp_path / "project-b").mkdir()
    removing = shutil.rmtree

    def raced(path, *args, **kwargs):  # the other remover takes the file first, then this one walks on
        monkeypatch.setattr(shutil, "rmtree", removing)
        (folder / "session.jsonl").unlink()
        raise FileNotFoundError(2, "No such file or directory", str(folder / "session.jsonl"))

    monkeypatch.setattr(shutil, "rmtree", raced)
    assert remove_session(tmp_path, "s-1") == 1
    assert not folder.exists() and (tmp_path / "project-b").is_dir()
