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
  same seq, same bytes) that consumers drop by seq.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from prometheus_client import Counter, Gauge

from dsh_core.errors import CorruptionError, DshError, PipelineError, StateStoreError
from dsh_core.storage.layout import find_session_files
from dsh_kafka.records import SessionRecord

from .session_tail import Position, read_new

__all__ = ["ShipperConfig", "Shipper", "Checkpoints", "check_root"]

SHIPPED_RECORDS = Counter("dsh_shipper_records_total", "Records shipped, by kind.", ["kind"])
SHIPPED_EVENTS = Counter("dsh_shipper_events_total", "Session events shipped.")
SHIPPER_ERRORS = Counter("dsh_shipper_errors_total", "Session files and directories refused, by error class.", ["error"])
SESSIONS = Gauge("dsh_shipper_sessions", "Session files followed, by state.", ["state"])

class Checkpoints:
    """The per-file positions, persisted atomically. A file that cannot be
    read or written is a :class:`StateStoreError` naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.positions: dict[str, Position] = {}
        try:
            if path.exists():
                raw = json.loads(path.read_text("utf-8"))
                self.positions = {name: Position(**entry) for name, entry in raw["files"].items()}
        except OSError as error:
            raise StateStoreError(f"{path}: cannot read the shipper's checkpoints: {error.strerror or error}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise StateStoreError(f"{path}: not a shipper checkpoint file ({type(error).__name__}: {error}); move it "
                                  "away to ship the root again from the start (consumers skip the repeats)") from None

    def save(self) -> None:
        temp = self.path.with_suffix(".tmp")
        payload = {"files": {name: position.__dict__ for name, position in sorted(self.positions.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "w", encoding="utf-8") as stream:
                json.dump(payload, stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temp, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            raise StateStoreError(f"{self.path}: cannot write the shipper's checkpoints: "
                                  f"{error.strerror or error}") from None


@dataclass(frozen=True)
class ShipperConfig:
    root: Path
    state_dir: Path
    poll_seconds: float = 0.5
    once: bool = False


def check_root(root: Path) -> None:
    """Raise :class:`PipelineError` unless ``root`` is a directory to ship."""
    if not root.is_dir():
        raise PipelineError(f"{root}: the sessions root " + ("is not a directory" if root.exists() else
                                                             "does not exist"))


class Shipper:
    """Ships a sessions root through ``send`` (e.g. :meth:`Publisher.send`)."""

    def __init__(self, config: ShipperConfig, send: Callable[[SessionRecord], Any], flush: Callable[[], Any],
                 report: Callable[[str], None]) -> None:
        check_root(config.root)
        self.config = config
        self._send = send
        self._flush = flush
        self._report = report
        self.checkpoints = Checkpoints(config.state_dir / "shipper-checkpoints.json")
        self._reported: set[str] = set()

    async def ship_once(self) -> int:
        """One pass over the root; returns the number of records shipped."""
        shipped = 0
        moved: dict[str, Position] = {}
        files = find_session_files(self.config.root, self._refuse_entry)
        for path in files:
            name = str(path.relative_to(self.config.root))
            position = self.checkpoints.positions.get(name, Position())
            if position.failed:
                if name not in self._reported:  # refused before this process: say so once again
                    self._reported.add(name)
                    self._report(f"refused earlier, not shipped: {position.failed}")
                continue
            while True:
                try:
                    read = read_new(path, position)
                except OSError as error:  # unreadable now (permissions, replaced): said once, tried again next pass
                    self._refuse_entry(CorruptionError(f"{path}: cannot be read: {error.strerror or error}"))
                    break
                for record in read.records:
                    await self._send(record)
                    SHIPPED_RECORDS.labels(record.kind).inc()
                    SHIPPED_EVENTS.inc(record.count)
                shipped += len(read.records)
                if read.error is not None:
                    self._reported.add(name)
                    SHIPPER_ERRORS.labels(type(read.error).__name__).inc()
                    self._report(f"refused {type(read.error).__name__}: {read.error.message}")
                    moved[name] = Position(**{**read.position.__dict__, "failed": read.error.message})
                    break
                if read.position.offset == position.offset:
                    break
                position = read.position
                moved[name] = position
        if moved:
            await self._flush()  # broker acks first, then the checkpoint
            self.checkpoints.positions.update(moved)
            self.checkpoints.save()
        states = [p for p in self.checkpoints.positions.values()]
        SESSIONS.labels("shipping").set(sum(1 for p in states if not p.failed))
        SESSIONS.labels("refused").set(sum(1 for p in states if p.failed))
        return shipped

    def _refuse_entry(self, error: DshError) -> None:
        if error.message not in self._reported:  # said once per process, like a refused file
            self._reported.add(error.message)
            SHIPPER_ERRORS.labels(type(error).__name__).inc()
            self._report(f"refused {type(error).__name__}: {error.message}")

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the root until ``stop`` is set (``once``: one pass)."""
        while True:
            await self.ship_once()
            if self.config.once or stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), self.config.poll_seconds)
            except asyncio.TimeoutError:
                pass
