"""A sessions root with hostile entries beside an honest session: the
shipper reports each entry with its path and reason and ships the honest
session exactly (no broker: records are collected as they are sent)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import zstandard

from dsh_core.storage.framing import FRAME_PLAINTEXT_LIMIT, compress_frame
from dsh_kafka.topics import MAX_MESSAGE_BYTES
from producers.shipper import Shipper, ShipperConfig
from tests.conftest import corpus_logs, expected_of
from tests.layout_helpers import place, storage_lines


def _honest_log() -> tuple[bytes, dict]:
    log = next(log for log in corpus_logs("dsh-real") if expected_of(log)["accepted"]
               and expected_of(log)["repair"] is None)
    return log.read_bytes(), expected_of(log)


def _header(session_id: str) -> bytes:
    """The honest log's header, for another session in the hostile project."""
    header = json.loads(_honest_log()[0].split(b"\n", 1)[0])
    return json.dumps(header | {"id": session_id, "cwd": "/work/hostile"}).encode()


def _bomb() -> bytes:
    """One frame that inflates past the frame limit, compressed piece by piece."""
    compressing = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    zeros = bytes(1 << 20)
    frame = b"".join(compressing.compress(zeros) for _ in range((FRAME_PLAINTEXT_LIMIT >> 20) + 2))
    return frame + compressing.flush()


def _collecting_shipper(root: Path, state: Path) -> tuple[Shipper, list, list[str]]:
    """A shipper of ``root`` whose records and reports are collected."""
    sent: list = []
    reports: list[str] = []

    async def send(record) -> None:
        sent.append(record)

    async def flush() -> None:
        pass

    return Shipper(ShipperConfig(root, state, once=True), send, flush, reports.append), sent, reports


def test_hostile_entries_are_reported_and_the_honest_session_ships(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    log, expected = _honest_log()
    place(root, log, "none")
    project = root / "--work-hostile--"
    (project / "dir-not-file" / "session.jsonl").mkdir(parents=True)
    (project / "long-line").mkdir()
    (project / "long-line" / "session.jsonl").write_bytes(
        _header("long-line") + b"\n" + b'{"seq": 0, "pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}\n')
    (project / "bomb").mkdir()
    (project / "bomb" / "session.jsonl.zstd").write_bytes(compress_frame(_header("bomb") + b"\n") + _bomb())
    (outside / "escaped").mkdir(parents=True)
    (outside / "escaped" / "session.jsonl").write_bytes(log)
    (project / "escaped").symlink_to(outside / "escaped")

    shipper, sent, reports = _collecting_shipper(root, tmp_path / "state")
    asyncio.run(shipper.ship_once())

    honest_id = expected["sessionHeader"]["id"]
    assert [r.value for r in sent if r.session_id == honest_id][1:] == storage_lines(log)
    assert {r.session_id for r in sent} <= {honest_id, "long-line", "bomb"}  # headers of the refused two
    said = "\n".join(reports)
    assert f"{project / 'dir-not-file' / 'session.jsonl'}: not a regular file" in said
    assert f"{project / 'escaped'}: a symbolic link; links in a sessions root are not followed" in said
    assert "long-line/session.jsonl: line 2 is longer than the 16777216-byte record limit" in said
    assert "bomb/session.jsonl.zstd: a Zstandard frame of" in said and "decompression bomb" in said
    assert len(reports) == 4, reports


def test_one_session_id_under_two_projects_ships_once_and_the_second_is_reported(tmp_path):
    from dsh_core.storage.layout import find_session_files
    root = tmp_path / "root"
    log, expected = _honest_log()
    first = place(root, log, "none")
    second = root / "--elsewhere--" / first.parent.name / "session.jsonl"
    second.parent.mkdir(parents=True)
    second.write_bytes(log)
    refused = []
    found = find_session_files(root, refused.append)
    assert len(found) == 1 and len(refused) == 1
    assert f"is also at {found[0].parent}; a root holds one log per session id" in refused[0].message


def test_entries_that_change_or_cannot_be_read_are_reported_and_the_pass_goes_on(tmp_path, monkeypatch):
    import producers.shipper as shipper_module

    root = tmp_path / "root"
    log, expected = _honest_log()
    lines = storage_lines(log)
    honest = place(root, log.split(b"\n", 1)[0] + b"\n" + b"".join(line + b"\n" for line in lines[:5]), "none")
    project = root / "--work-hostile--"
    nine_mib = b'{"seq": 0, "pad": "' + b"x" * (9 << 20) + b'"}'
    for name, body in (("nine-mib-line", nine_mib), ("becomes-a-folder", b'{"seq": 0}'),
                       ("unreadable", b'{"seq": 0}')):
        (project / name).mkdir(parents=True)
        (project / name / "session.jsonl").write_bytes(_header(name) + b"\n" + body + b"\n")
    read_new = shipper_module.read_new

    def unreadable(path, position):
        if path.parent.name == "unreadable":
            raise PermissionError(13, "Permission denied")
        return read_new(path, position)

    monkeypatch.setattr(shipper_module, "read_new", unreadable)
    shipper, sent, reports = _collecting_shipper(root, tmp_path / "state")
    asyncio.run(shipper.ship_once())
    assert [r.value for r in sent if r.session_id == "nine-mib-line"][1:] == [nine_mib]  # under the limit: shipped
    assert [r.value for r in sent if r.session_id == "becomes-a-folder"][1:] == [b'{"seq": 0}']
    assert reports == [f"refused CorruptionError: {project / 'unreadable' / 'session.jsonl'}: cannot be read: "
                       "Permission denied"]

    becomes = project / "becomes-a-folder" / "session.jsonl"
    becomes.unlink()
    becomes.mkdir()
    honest.write_bytes(honest.read_bytes() + b"".join(line + b"\n" for line in lines[5:]))
    asyncio.run(shipper.ship_once())  # the folder is reported, the honest session goes on
    assert [r.value for r in sent if r.session_id == expected["sessionHeader"]["id"]][1:] == lines
    assert f"{becomes}: not a regular file" in reports[-1] and len(reports) == 2
