"""The shipper's checkpoints belong to a destination (cluster id and
events topic), and a refused file is read again once it changed (no
broker: records are collected as they are sent)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from pathlib import Path

from producers.errors import CheckpointFileError
from dsh_core.storage.layout import log_path
from producers.shipper import CHECKPOINTS_FILE, Destination, Shipper, ShipperConfig

HERE, THERE = Destination("cluster-a", "dsh.session-events"), Destination("cluster-b", "dsh.session-events")


def events(first: int, count: int) -> bytes:
    """Record lines of seqs ``first`` on, as dsh writes them."""
    return b"".join(json.dumps({"type": "user/message", "seq": seq, "time": 1767225600001 + seq, "surfaceOp": "append",
                                "data": {"id": f"u{seq}", "role": "user", "content": [{"type": "text", "text": "hi"}]}},
                               separators=(",", ":")).encode() + b"\n" for seq in range(first, first + count))


def write_session(root: Path, session_id: str, count: int = 2, cwd: str = "/w") -> Path:
    """A raw v0 log of ``count`` events in dsh's layout."""
    path = log_path(root, cwd, session_id, "none")
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"type": "session", "version": 0, "id": session_id, "createdAt": 1767225600000, "cwd": cwd,
              "delegationDepth": 0}
    path.write_bytes(json.dumps(header).encode() + b"\n" + events(0, count))
    return path


def append(path: Path, first: int, count: int) -> None:
    with open(path, "ab") as log:
        log.write(events(first, count))


class Collected:
    """A shipper's records and lines, collected."""

    def __init__(self) -> None:
        self.sent: list = []
        self.lines: list[str] = []

    async def send(self, record) -> None:
        self.sent.append(record)

    async def flush(self) -> None:
        pass

    def seqs(self, session_id: str) -> list[int]:
        return [r.seq for r in self.sent if r.session_id == session_id and r.kind == "record"]


def ship(root, state, destination: Destination, collected: Collected | None = None):
    """One ``--once`` pass to ``destination``: its summary and what it sent and said."""
    collected = collected or Collected()
    shipper = Shipper(ShipperConfig(root, state, once=True), collected.send, collected.flush, collected.lines.append,
                      say=collected.lines.append, destination=destination)
    return asyncio.run(shipper.ship_once()), collected


def test_another_cluster_or_topic_ships_the_root_from_the_start_and_the_first_resumes(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    path = write_session(root, "s-1", count=3)
    first, shipped = ship(root, state, HERE)
    assert (first.records, shipped.lines) == (1 + 3, [])  # the header, then the records
    assert ship(root, state, HERE)[0].records == 0

    elsewhere, there = ship(root, state, THERE)
    assert elsewhere.records == 1 + 3 and there.seqs("s-1") == [0, 1, 2]
    assert there.lines == ["nothing shipped to topic dsh.session-events of cluster cluster-b yet: shipping the root "
                           "from the start (the checkpoints of 1 other destination(s) are kept)"]
    other_topic, said = ship(root, state, Destination("cluster-a", "eco3.dsh.session-events"))
    assert other_topic.records == 1 + 3 and "of 2 other destination(s)" in said.lines[0]

    append(path, 3, 2)
    back, resumed = ship(root, state, HERE)
    assert resumed.seqs("s-1") == [3, 4] and resumed.lines == []
    assert ship(root, state, THERE)[1].seqs("s-1") == [3, 4]
    stored = json.loads((state / CHECKPOINTS_FILE).read_text())
    assert stored["version"] == 2 and [(d["cluster"], d["topic"]) for d in stored["destinations"]] == [
        ("cluster-a", "dsh.session-events"), ("cluster-a", "eco3.dsh.session-events"),
        ("cluster-b", "dsh.session-events")]


def test_a_checkpoint_file_from_before_destinations_is_taken_by_the_first_one_shipped_to(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    path = write_session(root, "s-1", count=3)
    ship(root, state, HERE)
    stored = json.loads((state / CHECKPOINTS_FILE).read_text())
    [positions] = [d["files"] for d in stored["destinations"]]
    for position in positions.values():  # as the shipper wrote them before checkpoints named their destination
        del position["failed_as"]
    (state / CHECKPOINTS_FILE).write_text(json.dumps({"files": positions}))

    upgraded, said = ship(root, state, THERE)
    assert upgraded.records == 0 and said.lines == [
        f"{state / CHECKPOINTS_FILE}: checkpoints written before they named the cluster and topic are taken as those "
        "of topic dsh.session-events of cluster cluster-b"]
    assert ship(root, state, THERE)[1].lines == []  # said once: the file names its destination now
    append(path, 3, 1)
    assert ship(root, state, THERE)[1].seqs("s-1") == [3]
    assert ship(root, state, HERE)[0].records == 1 + 4  # another destination starts from the start


@pytest.mark.parametrize("content", [b"{", b'{"files": {"a": {"offset": "x"}}}', b'{"version": 2, "destinations": 3}'])
def test_a_checkpoint_file_that_is_not_one_is_named(tmp_path, content):
    root, state = tmp_path / "root", tmp_path / "state"
    write_session(root, "s-1")
    state.mkdir()
    (state / CHECKPOINTS_FILE).write_bytes(content)
    with pytest.raises(CheckpointFileError, match=f"{state / CHECKPOINTS_FILE}: not a shipper checkpoint file"):
        ship(root, state, HERE)


def test_a_refused_file_is_skipped_while_unchanged_and_read_again_from_its_checkpoint_once_repaired(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    path = write_session(root, "s-1", count=4)
    good = path.read_bytes()
    path.write_bytes(good.replace(b'"seq":2,', b'"seq":9,'))  # a gap at the third record
    refused, first = ship(root, state, HERE)
    assert first.seqs("s-1") == [0, 1] and (refused.refused, refused.skipped) == (1, 0)

    unchanged, second = ship(root, state, HERE)
    assert (unchanged.refused, unchanged.skipped, second.sent) == (0, 1, [])
    assert second.lines == ["refused earlier, not shipped: session 's-1': expected seq 2, got 9 at "
                            f"{path}: line 4"]

    stat = path.stat()
    path.write_bytes(good)  # repaired in place, same size, its time set back: the digest tells
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    repaired, third = ship(root, state, HERE)
    assert third.seqs("s-1") == [2, 3] and (repaired.refused, repaired.skipped) == (0, 0)
    offset = len(good.split(b"\n", 1)[0]) + 1 + len(events(0, 2))
    assert third.lines == [f"{path}: changed since it was refused: read again from byte {offset}"]
    assert ship(root, state, HERE)[0].records == 0


def test_a_refused_file_that_shrank_below_its_checkpoint_or_was_replaced_is_read_from_the_start(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    path = write_session(root, "s-1", count=4)
    ship(root, state, HERE)
    log = path.read_bytes()
    path.write_bytes(log[:-len(events(3, 1))])  # rewritten shorter after shipping
    refused, first = ship(root, state, HERE)
    assert refused.refused == 1 and "file shrank to" in first.lines[0]

    replacement = path.with_name("replacement")
    replacement.write_bytes(log + events(4, 1))
    os.replace(replacement, path)  # the log put back, and longer
    again, second = ship(root, state, HERE)
    assert second.seqs("s-1") == [0, 1, 2, 3, 4] and (again.refused, again.skipped) == (0, 0)
    assert second.lines == [f"{path}: changed since it was refused (shrank or replaced): read again from the start"]
