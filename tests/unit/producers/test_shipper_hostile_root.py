"""A sessions root with hostile entries beside an honest session: the
shipper reports each entry with its path and reason and ships the honest
session exactly (no broker: records are collected as they are sent)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from dsh_core.storage.framing import FRAME_PLAINTEXT_LIMIT, compress_frame
from dsh_kafka.topics import MAX_MESSAGE_BYTES
from producers.shipper import Destination, Shipper, ShipperConfig
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
    """One frame of short lines that inflates past the frame limit, compressed piece by piece."""
    compressing = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    lines = (b"0" * 1023 + b"\n") * 1024
    frame = b"".join(compressing.compress(lines) for _ in range((FRAME_PLAINTEXT_LIMIT >> 20) + 2))
    return frame + compressing.flush()


DESTINATION = Destination("a-cluster", "dsh.session-events")


def _collecting_shipper(root: Path, state: Path) -> tuple[Shipper, list, list[str]]:
    """A shipper of ``root`` whose records and reports are collected."""
    sent: list = []
    reports: list[str] = []

    async def send(record) -> None:
        sent.append(record)

    async def flush() -> None:
        pass

    return Shipper(ShipperConfig(root, state, once=True), send, flush, reports.append, say=reports.append,
                   destination=DESTINATION), sent, reports


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
    assert "bomb/session.jsonl.zstd: the Zstandard frame at byte " in said and "decompression bomb" in said
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
    class UnreadableTail(shipper_module.SessionTail):  # root reads any file: the refusal is played
        def __iter__(self):
            if self.path.parent.name == "unreadable":
                raise PermissionError(13, "Permission denied")
            return super().__iter__()

    monkeypatch.setattr(shipper_module, "SessionTail", UnreadableTail)
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


_PEAK_RSS = """
import asyncio, sys
from pathlib import Path
from benchmarks import peak_rss_kb
from dsh_pipeline.cli import main as cli
from producers.shipper import Destination, Shipper, ShipperConfig

async def ship(root, state):
    async def discard(record): pass
    async def flush(): pass
    await Shipper(ShipperConfig(Path(root), Path(state), once=True), discard, flush, print, say=print,
                  destination=Destination("c", "t")).ship_once()

if sys.argv[1] == "ship":
    asyncio.run(ship(*sys.argv[2:]))
else:
    cli(["inspect", sys.argv[2]])
print(peak_rss_kb() // 1024)
"""


def _peak_rss_mib(*argv: str) -> int:
    """Peak RSS (MiB) of a child process shipping a root or inspecting a file."""
    child = subprocess.run([sys.executable, "-c", _PEAK_RSS, *argv], capture_output=True, text=True, timeout=300,
                           cwd=Path(__file__).parents[3])
    assert child.returncode == 0, child.stderr
    return int(child.stdout.split()[-1])


def test_a_decompression_bomb_peaks_below_256_mib_in_the_shipper_and_in_inspect(tmp_path):
    root = tmp_path / "root"
    (root / "--w--" / "bomb").mkdir(parents=True)
    bomb = root / "--w--" / "bomb" / "session.jsonl.zstd"
    bomb.write_bytes(compress_frame(_header("bomb") + b"\n") + _bomb())  # 256 MiB of short lines, and more
    shipping, inspecting = _peak_rss_mib("ship", str(root), str(tmp_path / "state")), _peak_rss_mib("inspect", str(bomb))
    assert shipping <= 256 and inspecting <= 256, f"peak RSS: ship {shipping} MiB, inspect {inspecting} MiB"


def test_logs_outside_dsh_layout_are_layout_errors_that_say_the_layout(tmp_path):
    root = tmp_path / "root"
    log, expected = _honest_log()
    honest = place(root, log, "none")
    (root / "flat.jsonl").write_bytes(log)  # a flat root
    (root / "a-session").mkdir()
    (root / "a-session" / "session.jsonl.zstd").write_bytes(b"")  # the project folder missing
    (root / "--p--").mkdir()
    (root / "--p--" / "old.jsonl").write_bytes(log)  # dsh's obsolete flat layout
    moved = root / "--p--" / "not-its-id" / "session.jsonl"  # a folder named for another session
    moved.parent.mkdir()
    moved.write_bytes(log)

    shipper, sent, reports = _collecting_shipper(root, tmp_path / "state")
    summary = asyncio.run(shipper.ship_once())

    layout = ("dsh keeps each session at <root>/<project>/<session-id>/session[.vN].jsonl[.zstd] (lay logs out "
              "with `dsh-pipeline ship --layout-from FILE... --root ROOT`)")
    assert sorted(reports) == sorted([
        f"refused LayoutError: {root / 'flat.jsonl'}: a session log directly in the sessions root; {layout}",
        f"refused LayoutError: {root / 'a-session' / 'session.jsonl.zstd'}: a session folder directly in the sessions "
        f"root (its project folder is missing); {layout}",
        f"refused LayoutError: {root / '--p--' / 'old.jsonl'}: a flat session file (dsh's obsolete layout); {layout}",
        f"refused LayoutError: {moved}: the header's session id {expected['sessionHeader']['id']!r} belongs in a "
        f"folder named {honest.parent.name!r}, not 'not-its-id'; {layout}"])
    assert [r.value for r in sent][1:] == storage_lines(log)  # the honest session alone
    assert (summary.sessions, summary.records, summary.refused, summary.skipped) == (2, len(sent), 4, 0)


def test_lay_out_copies_logs_where_dsh_keeps_them_and_never_overwrites(tmp_path):
    from dsh_core.errors import LayoutError
    from dsh_core.lay_out import lay_out

    log, expected = _honest_log()
    source = tmp_path / "exported" / "anything.jsonl"
    source.parent.mkdir()
    source.write_bytes(log)
    root = tmp_path / "root"
    target = lay_out(source, root)
    assert target == root / place(tmp_path / "expected", log, "none").relative_to(tmp_path / "expected")
    assert target.read_bytes() == log
    assert lay_out(source, root) is None  # the same bytes are there already
    source.write_bytes(log + b"\n")
    with pytest.raises(LayoutError, match=f"not laid out: {target} holds another log of session"):
        lay_out(source, root)
    assert target.read_bytes() == log


def test_an_idle_pass_reads_no_session_folder_and_opens_no_file(tmp_path, monkeypatch):
    import os

    import producers.shipper as shipper_module

    root = tmp_path / "root"
    log, expected = _honest_log()
    paths = [place(root, log.replace(expected["sessionHeader"]["id"].encode(), f"s-{n}".encode()), "none")
             for n in range(20)]
    for path in paths:  # settled folders (one changed within the file system's timestamp granularity is read again)
        os.utime(path.parent, (1, 1))
    shipper, sent, reports = _collecting_shipper(root, tmp_path / "state")
    asyncio.run(shipper.ship_once())
    assert len({r.session_id for r in sent}) == 20 and not reports

    scanned, opened = [], []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda folder: scanned.append(str(folder)) or scandir(folder))

    class CountedTail(shipper_module.SessionTail):
        def __iter__(self):
            opened.append(self.path)
            return super().__iter__()

    monkeypatch.setattr(shipper_module, "SessionTail", CountedTail)
    asyncio.run(shipper.ship_once())
    assert scanned == [str(root), str(paths[0].parent.parent)] and opened == []  # the root and its one project

    with open(paths[3], "ab") as appending:
        appending.write(log.split(b"\n", 2)[1] + b"\n")  # a repeat of seq 0: read, and refused
    asyncio.run(shipper.ship_once())
    assert opened == [paths[3]] and reports == [f"refused SequenceGapError: session 's-3': expected seq "
                                                f"{expected['eventCount']}, got 0 at {paths[3]}: line {len(storage_lines(log)) + 2}"]


def test_a_log_swapped_for_a_link_or_a_fifo_after_the_scan_is_refused_not_followed_or_waited_on(tmp_path, monkeypatch):
    """Between the pass's look at a session folder and its opening of the
    log, whoever can write the root swaps the log for a symbolic link (to a
    file of the shipping user's), the session folder for a link to a folder
    elsewhere, or the log for a fifo: the links are refused, never read
    through; the fifo is refused at once, never blocking the pass."""
    import os
    import threading

    import producers.shipper as shipper_module

    root = tmp_path / "root"
    log, expected = _honest_log()
    place(root, log, "none")
    secret = tmp_path / "secret"
    secret.write_bytes(_header("to-link") + b"\n" + b'{"seq": 0, "secret": "of the shipping user"}\n')
    project = root / "--work-hostile--"
    elsewhere = tmp_path / "elsewhere" / "folder-to-link"
    elsewhere.mkdir(parents=True)
    (elsewhere / "session.jsonl").write_bytes(secret.read_bytes().replace(b"to-link", b"folder-to-link"))
    for name in ("to-link", "to-fifo", "folder-to-link"):
        (project / name).mkdir(parents=True)
        (project / name / "session.jsonl").write_bytes(_header(name) + b"\n")

    class SwappingTail(shipper_module.SessionTail):
        def __iter__(self):
            folder = self.path.parent
            if folder.name in ("to-link", "to-fifo") and not self.path.is_symlink() and self.path.is_file():
                self.path.unlink()
                if folder.name == "to-link":
                    self.path.symlink_to(secret)
                else:
                    os.mkfifo(self.path)
            elif folder.name == "folder-to-link" and not folder.is_symlink():
                (folder / "session.jsonl").unlink()
                folder.rmdir()
                folder.symlink_to(elsewhere)
            return super().__iter__()

    monkeypatch.setattr(shipper_module, "SessionTail", SwappingTail)
    shipper, sent, reports = _collecting_shipper(root, tmp_path / "state")
    passing = threading.Thread(target=asyncio.run, args=(shipper.ship_once(),), daemon=True)
    passing.start()
    passing.join(60)
    if passing.is_alive():  # blocked opening the fifo: give it a writer, then fail
        with open(project / "to-fifo" / "session.jsonl", "wb"):
            pass
        passing.join(10)
        pytest.fail("the pass blocked on a fifo put in place of a log")
    assert not [r for r in sent if b"of the shipping user" in r.value]
    assert {r.session_id for r in sent} == {expected["sessionHeader"]["id"]}
    said = "\n".join(reports)
    assert f"{project / 'to-link' / 'session.jsonl'}: a symbolic link; links in a sessions root are not followed" \
        in said
    assert f"{project / 'to-fifo' / 'session.jsonl'}: not a regular file" in said
    assert f"{project / 'folder-to-link'}: a symbolic link; links in a sessions root are not followed" in said
