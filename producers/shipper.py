"""The shipper: follows a dsh sessions root and ships every session's records.

* Discovery: ``<root>/<project>/<session>/session[.vN].jsonl[.zstd]`` (dsh's
  layout; of a session dsh migrated, the newest generation). Every format
  this build reads is shipped as stored; records carry the header's
  version in ``dsh-format``.
* Tailing and checking (:mod:`producers.session_tail`): a session file is
  read from its checkpointed byte offset, complete records only; header,
  records and seqs are checked. A failing file is reported once (named
  error, path, line, seq) and stops shipping; every other session keeps
  going.
* Durability: after each pass the publisher is flushed (broker acks) and
  only then the checkpoints file is replaced atomically (write, fsync,
  rename). A crash — even ``kill -9`` — resumes from the last checkpoint, so
  a record is never lost; re-shipped records are exact repeats (same key,
  same seq, same bytes) that consumers drop by seq. When delivery fails
  (the publisher's deadline passed during an outage) the checkpoint moves
  to what the cluster acknowledged, nothing further, and the error is
  raised: a restart ships no repeat of an acknowledged record. Checkpoints are kept
  for each destination (cluster id and events topic,
  :mod:`producers.shipper_checkpoints`).
* Refusals: a refused file is marked (size, mtime, inode, digest); while
  the mark holds it is skipped, once the file changed it is read again
  from its checkpoint (from the start if it shrank below it or was
  replaced).
* Following (:mod:`producers.root_watch`): with inotify a pass looks only
  at the folders that changed, and the whole root is read again every
  ``rescan_seconds``; without it, every pass reads the whole root (a
  session folder whose mtime is unchanged is not listed again).
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from prometheus_client import Counter, Gauge

from dsh_core.errors import CorruptionError, DshError, FormatUnsupportedError, LayoutError, PipelineError
from dsh_core.storage.layout import LAYOUT, SessionRoot
from dsh_kafka.errors import DeliveryError
from dsh_kafka.records import SessionRecord

from .publisher import acknowledged
from .root_watch import RootWatch
from .session_tail import FileMark, Position, SessionTail
from .shipper_checkpoints import Checkpoints, Destination

__all__ = ["ShipperConfig", "Shipper", "Checkpoints", "Destination", "PassSummary", "check_root", "LAYOUT_COMMAND",
           "CHECKPOINTS_FILE"]

#: The checkpoints file, in the state folder.
CHECKPOINTS_FILE = "shipper-checkpoints.json"

#: The command that lays session logs out in dsh's layout.
LAYOUT_COMMAND = "dsh-pipeline ship --layout-from FILE... --root ROOT"

SHIPPED_RECORDS = Counter("dsh_shipper_records_total", "Records shipped, by kind.", ["kind"])
SHIPPED_EVENTS = Counter("dsh_shipper_events_total", "Session events shipped.")
SHIPPER_ERRORS = Counter("dsh_shipper_errors_total", "Session files and directories refused, by error class.", ["error"])
SESSIONS = Gauge("dsh_shipper_sessions", "Session files followed, by state.", ["state"])

@dataclass(frozen=True)
class ShipperConfig:
    root: Path
    state_dir: Path
    poll_seconds: float = 0.5
    once: bool = False
    summary_seconds: float = 60.0  # following: a summary line this often
    rescan_seconds: float = 300.0  # following with inotify: the whole root is read again this often


def check_root(root: Path) -> None:
    """Raise :class:`PipelineError` unless ``root`` is a directory to ship."""
    if not root.is_dir():
        raise PipelineError(f"{root}: the sessions root " + ("is not a directory" if root.exists() else
                                                             "does not exist"))


@dataclass
class PassSummary:
    """What passes over the root did: records and events shipped (summed
    over the passes), and of the latest pass the session logs found, the
    files and entries refused, the logs skipped because they were refused
    before."""

    sessions: int = 0
    records: int = 0
    events: int = 0
    refused: int = 0
    skipped: int = 0

    def add(self, later: "PassSummary") -> None:
        self.sessions = later.sessions
        self.records += later.records
        self.events += later.events
        self.refused = later.refused
        self.skipped = later.skipped

    def __str__(self) -> str:
        return (f"{self.sessions} sessions, {self.records} records ({self.events} events) shipped, "
                f"{self.refused} refused, {self.skipped} skipped (refused earlier)")


_UNREAD = Position()


class _Acked:
    """How far one file's records were acknowledged: the positions read,
    each with the delivery of the last record before it. One file's
    records share a key, so the cluster acknowledges them in order."""

    def __init__(self, start: Position) -> None:
        self.position = start
        self._marks: collections.deque[tuple[Any, Position]] = collections.deque()

    def read(self, delivery: Any, position: Position) -> None:
        """``position`` covers the records sent up to ``delivery``'s."""
        if delivery is not None and position is not self.position and (
                not self._marks or self._marks[-1][1] is not position):
            self._marks.append((delivery, position))
        self.settle()

    def settle(self) -> Position:
        """The furthest position whose records were all acknowledged."""
        while self._marks and acknowledged(self._marks[0][0]):
            self.position = self._marks.popleft()[1]
        return self.position


def _mark(path: Path, offset: int) -> FileMark | None:
    """The file's mark now, or ``None`` when it cannot be read (or is no
    longer a regular file)."""
    try:
        return FileMark.of(path, offset)
    except (OSError, CorruptionError):
        return None


#: The longest the shipper reads and sends without letting the event loop
#: run (signals, the ops server, the Kafka client's own work).
_SLICE_SECONDS = 0.05


class Shipper:
    """Ships a sessions root to ``destination`` through ``send`` (e.g.
    :meth:`Publisher.send`); ``report`` gets each refusal (said once per
    process), ``say`` each summary line and notice. Following (not
    ``once``), it holds inotify watches until :meth:`close`."""

    def __init__(self, config: ShipperConfig, send: Callable[[SessionRecord], Any], flush: Callable[[], Any],
                 report: Callable[[str], None], *, say: Callable[[str], None], destination: Destination) -> None:
        check_root(config.root)
        self.config = config
        self._send = send
        self._flush = flush
        self._report, self._say = report, say
        self.checkpoints = Checkpoints(config.state_dir / CHECKPOINTS_FILE)
        notice = self.checkpoints.ship_to(destination)
        if notice:
            say(notice)
        self._watch = None if config.once else RootWatch(str(config.root), say)
        self._root = SessionRoot(config.root, self._watch.watch if self._watch else lambda folder: None)
        self._rescan_at = 0.0
        self._reported: set[str] = set()
        self._slice_ends = 0.0

    def __enter__(self) -> "Shipper":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the watches (idempotent)."""
        if self._watch is not None:
            self._watch.close()

    async def ship_once(self, stop: asyncio.Event | None = None) -> PassSummary:
        """One pass over the root (following with inotify: over what changed
        since the last), until done or ``stop`` is set; the checkpoint then
        holds every record sent (flushed first)."""
        stop = stop or asyncio.Event()
        summary = PassSummary()
        moved: dict[str, Position] = {}
        acked: dict[str, _Acked] = {}
        files = self._look(summary)
        summary.sessions = len(self._root)
        try:
            await self._ship(files, summary, stop, moved, acked)
            if moved:
                await self._flush()  # broker acks first, then the checkpoint
        except DeliveryError:
            moved = {name: done for name, file in acked.items()
                     if (done := file.settle()) != self.checkpoints.positions.get(name, _UNREAD)}
            if moved:  # what the cluster acknowledged, and nothing more
                self.checkpoints.update(moved)
                self.checkpoints.save()
            raise
        if moved:
            self.checkpoints.update(moved)
            self.checkpoints.save()
        refused = self.checkpoints.refused
        summary.skipped = sum(1 for name in refused if name not in moved and self.config.root / name in self._root)
        SESSIONS.labels("shipping").set(len(self.checkpoints.positions) - len(refused))
        SESSIONS.labels("refused").set(len(refused))
        return summary

    async def _ship(self, files: list[Path], summary: PassSummary, stop: asyncio.Event, moved: dict[str, Position],
                    acked: dict[str, "_Acked"]) -> None:
        """Send what ``files`` hold past their checkpoints; ``moved`` gets
        each file's new position, ``acked`` what the cluster acknowledged."""
        prefix = len(str(self.config.root)) + 1
        for path in files:
            if stop.is_set():
                break
            name = str(path)[prefix:]  # relative to the root
            checkpointed = self.checkpoints.positions.get(name, _UNREAD)
            position = self._start(path, name, checkpointed)
            if position is None:
                continue  # refused earlier, unchanged since
            try:
                if os.stat(path).st_size == position.offset:  # nothing new: not even opened
                    if position != checkpointed:
                        moved[name] = position
                    continue
                tail = SessionTail(path, position)
                acked[name] = _Acked(checkpointed)
                async for record in self._sent(tail, stop, acked[name]):
                    summary.records += 1
                    summary.events += record.count
            except OSError as error:  # unreadable now (permissions, replaced): said once, tried again when it changes
                self._refuse(summary, CorruptionError(f"{path}: cannot be read: {error.strerror or error}"))
                continue
            except (CorruptionError, FormatUnsupportedError, LayoutError) as error:
                self._refuse(summary, error, name)
                tail.position.failed, tail.position.failed_as = error.message, _mark(path, tail.position.offset)
            if tail.position != checkpointed:
                moved[name] = tail.position

    def _look(self, summary: PassSummary) -> list[Path]:
        """The logs this pass looks at: every one when the whole root is
        read, else those of the folders that changed."""
        refused: list[DshError] = []
        changed = self._watch.changed() if self._watch is not None else None
        if changed is None or time.monotonic() >= self._rescan_at:
            self._rescan_at = time.monotonic() + self.config.rescan_seconds
            files = self._root.scan(refused.append)
        else:
            files = self._root.update(changed, refused.append)
        for error in refused:
            self._refuse(summary, error)
        return files

    def _start(self, path: Path, name: str, position: Position) -> Position | None:
        """Where to read ``path`` from: ``None`` while it is refused and has
        not changed since."""
        if not position.failed:
            return position
        now = _mark(path, position.offset)
        if now is None or now == position.failed_as:
            if name not in self._reported:  # refused before this process: say so once again
                self._reported.add(name)
                self._report(f"refused earlier, not shipped: {position.failed}")
            return None
        self._reported.discard(name)
        was = position.failed_as
        if now.size < position.offset or (was is not None and (was.size < position.offset or was.inode != now.inode)):
            self._say(f"{path}: changed since it was refused (shrank or replaced): read again from the start")
            return Position()
        self._say(f"{path}: changed since it was refused: read again from byte {position.offset}")
        return replace(position, failed=None, failed_as=None)

    async def _sent(self, tail: SessionTail, stop: asyncio.Event, acked: _Acked) -> AsyncIterator[SessionRecord]:
        """Send the tail's records, yielding each once sent, until ``stop``;
        the event loop runs at least every :data:`_SLICE_SECONDS`. ``acked``
        learns each position read with the delivery before it."""
        delivery = None
        try:
            for record in tail:
                acked.read(delivery, tail.position)  # the tail moved past the records sent before this one
                delivery = await self._send(record)
                SHIPPED_RECORDS.labels(record.kind).inc()
                SHIPPED_EVENTS.inc(record.count)
                yield record
                if time.monotonic() >= self._slice_ends:
                    await asyncio.sleep(0)
                    self._slice_ends = time.monotonic() + _SLICE_SECONDS
                if stop.is_set():
                    return
        finally:
            acked.read(delivery, tail.position)

    def _refuse(self, summary: PassSummary, error: DshError, key: str | None = None) -> None:
        """Count a refused file or entry; say it once per process (by
        ``key``, else by its message)."""
        summary.refused += 1
        key = key or error.message
        if key not in self._reported:
            self._reported.add(key)
            SHIPPER_ERRORS.labels(type(error).__name__).inc()
            hint = f" (lay logs out with `{LAYOUT_COMMAND}`)" if isinstance(error, LayoutError) else ""
            self._report(f"refused {type(error).__name__}: {error.message}{hint}")

    async def run(self, stop: asyncio.Event) -> PassSummary:
        """Follow the root until ``stop`` is set (``once``: one pass), with
        a summary line after a single pass, every ``summary_seconds`` while
        following, and when stopped; returns what was said last."""
        period, said = PassSummary(), time.monotonic()
        while True:
            period.add(await self.ship_once(stop))
            if self.config.once or stop.is_set():
                break
            if time.monotonic() - said >= self.config.summary_seconds:
                self._say(f"following {self.config.root}: {period}")
                period, said = PassSummary(), time.monotonic()
            try:
                await asyncio.wait_for(stop.wait(), self.config.poll_seconds)
            except asyncio.TimeoutError:
                pass
        found = "" if period.sessions else f" (no session logs found: {LAYOUT})"
        if not stop.is_set():
            self._say(f"pass done: {period}{found}")
        else:
            self._say(f"stopped: {period}{found}; the checkpoint holds every record sent")
        return period
