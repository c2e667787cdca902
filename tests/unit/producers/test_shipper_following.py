"""A following shipper looks at what changed (inotify), misses no write,
and reads the whole root where inotify cannot be had (no broker: records
are collected as they are sent)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

import producers.root_watch as root_watch
from producers.shipper import Shipper, ShipperConfig
from tests.unit.producers.test_shipper_checkpoints import HERE, Collected, append, write_session


def following(root: Path, state: Path, collected: Collected, **config) -> Shipper:
    return Shipper(ShipperConfig(root, state, **config), collected.send, collected.flush, collected.lines.append,
                   say=collected.lines.append, destination=HERE)


def test_following_ships_what_is_written_after_the_watches_were_set(tmp_path):
    root = tmp_path / "root"
    first = write_session(root, "s-1")
    collected = Collected()
    with following(root, tmp_path / "state", collected) as shipper:
        asyncio.run(shipper.ship_once())
        assert collected.seqs("s-1") == [0, 1]
        append(first, 2, 3)  # a session grows
        second = write_session(root, "s-2")  # a new session in a known project
        third = write_session(root, "s-3", cwd="/elsewhere")  # a new project
        summary = asyncio.run(shipper.ship_once())
        assert (collected.seqs("s-1"), collected.seqs("s-2"), collected.seqs("s-3")) == ([0, 1, 2, 3, 4], [0, 1], [0, 1])
        assert (summary.sessions, summary.records) == (3, 3 + 3 + 3)
        append(second, 2, 1)
        append(third, 2, 1)
        asyncio.run(shipper.ship_once())
    assert (collected.seqs("s-2"), collected.seqs("s-3")) == ([0, 1, 2], [0, 1, 2])
    assert not collected.lines


def test_a_write_made_while_the_pass_reads_is_shipped_by_the_next(tmp_path, monkeypatch):
    import producers.shipper as shipper_module

    root = tmp_path / "root"
    paths = [write_session(root, f"s-{n}") for n in range(3)]
    written = []

    class WrittenToOnceRead(shipper_module.SessionTail):  # the writer appends just after the shipper read
        def __iter__(self):
            yield from super().__iter__()
            if self.path not in written:
                written.append(self.path)
                append(self.path, 2, 1)

    monkeypatch.setattr(shipper_module, "SessionTail", WrittenToOnceRead)
    collected = Collected()
    with following(root, tmp_path / "state", collected) as shipper:
        asyncio.run(shipper.ship_once())
        assert [collected.seqs(f"s-{n}") for n in range(3)] == [[0, 1]] * 3
        asyncio.run(shipper.ship_once())
    assert written == paths and [collected.seqs(f"s-{n}") for n in range(3)] == [[0, 1, 2]] * 3


def test_a_folder_watched_is_watched_before_it_is_read(tmp_path, monkeypatch):
    root = tmp_path / "root"
    write_session(root, "s-0")
    order: list[tuple[str, str]] = []
    watch, scandir = root_watch.RootWatch.watch, os.scandir
    monkeypatch.setattr(root_watch.RootWatch, "watch", lambda self, folder: order.append(("watch", folder))
                        or watch(self, folder))
    monkeypatch.setattr(os, "scandir", lambda folder: order.append(("read", str(folder))) or scandir(folder))
    with following(root, tmp_path / "state", Collected()) as shipper:
        asyncio.run(shipper.ship_once())
    folders = [str(root), str(root / "--w--"), str(root / "--w--" / "s-0")]
    assert [entry for entry in order if entry[1] in folders] == [
        step for folder in folders for step in (("watch", folder), ("read", folder))]


def test_an_idle_pass_reads_and_stats_nothing_and_a_change_costs_its_folder(tmp_path, monkeypatch):
    root = tmp_path / "root"
    paths = [write_session(root, f"s-{n}", cwd=f"/p{n % 3}") for n in range(30)]
    collected = Collected()
    with following(root, tmp_path / "state", collected) as shipper:
        asyncio.run(shipper.ship_once())
        assert len({r.session_id for r in collected.sent}) == 30

        calls: list[str] = []
        for name in ("stat", "lstat", "scandir", "open"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, lambda path, *a, _real=real, _name=name, **k:
                                calls.append(f"{_name} {path}") or _real(path, *a, **k))
        for _ in range(3):
            summary = asyncio.run(shipper.ship_once())
            assert (summary.sessions, summary.records, calls) == (30, 0, [])

        append(paths[7], 2, 1)
        asyncio.run(shipper.ship_once())
        assert collected.seqs("s-7") == [0, 1, 2]
        in_root = [call for call in calls if str(root) in call]  # (the checkpoint is saved beside it)
        assert in_root and all(str(paths[7].parent) in call or call == f"open {root}"  # the log opened from the root
                               for call in in_root), in_root  # that folder alone


def test_where_the_watch_limit_is_reached_that_is_said_once_and_each_pass_reads_the_whole_root(tmp_path, monkeypatch):
    root = tmp_path / "root"
    paths = [write_session(root, f"s-{n}") for n in range(3)]
    real = root_watch.INotify.add_watch
    watched: list[str] = []

    def add_watch(self, path, mask):
        if len(watched) == 2:  # the root and its project: then the limit
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        watched.append(path)
        return real(self, path, mask)

    monkeypatch.setattr(root_watch.INotify, "add_watch", add_watch)
    collected = Collected()
    with following(root, tmp_path / "state", collected) as shipper:
        asyncio.run(shipper.ship_once())
        for n, path in enumerate(paths):
            append(path, 2, n + 1)
        asyncio.run(shipper.ship_once())
        asyncio.run(shipper.ship_once())
    assert [collected.seqs(f"s-{n}") for n in range(3)] == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    [said] = collected.lines
    assert said.startswith(f"following {root} by reading all of it every pass: the inotify watch limit is reached "
                           "at 2 folders (fs.inotify.max_user_watches = ")


def test_lost_events_and_the_rescan_interval_read_the_whole_root(tmp_path, monkeypatch):
    from inotify_simple import Event

    root = tmp_path / "root"
    path = write_session(root, "s-0")
    collected = Collected()
    with following(root, tmp_path / "state", collected, rescan_seconds=3600) as shipper:
        asyncio.run(shipper.ship_once())
        scans = []
        scan = shipper._root.scan
        monkeypatch.setattr(shipper._root, "scan", lambda refuse: scans.append(1) or scan(refuse))
        asyncio.run(shipper.ship_once())
        assert scans == []
        inotify = shipper._watch._inotify
        read = inotify.read
        inotify.read = lambda timeout: read(timeout) + [Event(-1, root_watch.flags.Q_OVERFLOW, 0, "")]
        append(path, 2, 1)
        asyncio.run(shipper.ship_once())
        assert scans == [1] and collected.seqs("s-0") == [0, 1, 2]
        inotify.read = read
        shipper._rescan_at = 0.0  # the rescan interval is over
        asyncio.run(shipper.ship_once())
        assert scans == [1, 1]


@pytest.mark.parametrize("change", ["removed", "renamed", "project-removed"])
def test_folders_removed_or_renamed_are_forgotten(tmp_path, change):
    import shutil

    root = tmp_path / "root"
    paths = [write_session(root, f"s-{n}", cwd=f"/p{n}") for n in range(2)]
    collected = Collected()
    with following(root, tmp_path / "state", collected) as shipper:
        asyncio.run(shipper.ship_once())
        if change == "removed":
            shutil.rmtree(paths[0].parent)
        elif change == "renamed":  # a session folder named for another id: its header says where it belongs
            paths[0].parent.rename(paths[0].parent.with_name("another"))
        else:
            shutil.rmtree(paths[0].parent.parent)
        summary = asyncio.run(shipper.ship_once())
        append(paths[1], 2, 1)
        later = asyncio.run(shipper.ship_once())
    assert (summary.sessions, later.sessions, later.records, collected.seqs("s-1")) == (
        2 if change == "renamed" else 1, summary.sessions, 1, [0, 1, 2])
