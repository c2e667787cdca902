"""The shipper's checkpoints: how far each file of a root was shipped, for
each destination it was shipped to.

A destination is a Kafka cluster (its id, from the cluster's metadata) and
the events topic. Each has positions of its own: a root pointed at another
cluster or topic prefix is shipped from the start (and that is said), and
pointed back it resumes where it was left. The file, replaced atomically::

    {"version": 2, "destinations": [{"cluster": ID, "topic": NAME, "files": {PATH: POSITION}}]}

A file written before checkpoints named their destination
(``{"files": {...}}``) holds the positions of a destination it does not
name: they are taken as those of the first destination shipped to after
the upgrade, which is said.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .errors import CheckpointFileError
from .session_tail import Position

__all__ = ["Checkpoints", "Destination"]


@dataclass(frozen=True, order=True)
class Destination:
    """Where a root is shipped: a Kafka cluster, by its id, and the events topic."""

    cluster: str
    topic: str

    def __str__(self) -> str:
        return f"topic {self.topic} of cluster {self.cluster}"


class _Shipped(msgspec.Struct):
    """The positions of one destination."""

    cluster: str
    topic: str
    files: dict[str, Position]


class _Stored(msgspec.Struct, omit_defaults=True):
    """The checkpoint file: version 2 names each destination; version 1
    (no ``version`` field) held the ``files`` of one it did not name."""

    version: int = 1
    destinations: list[_Shipped] = []
    files: dict[str, Position] | None = None


_decode = msgspec.json.Decoder(_Stored).decode
_encode = msgspec.json.Encoder().encode


class Checkpoints:
    """The per-file positions of every destination, persisted atomically;
    :meth:`ship_to` chooses the destination whose :attr:`positions` are
    read and updated. A file that cannot be read or written is a
    :class:`CheckpointFileError` naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._destinations: dict[Destination, dict[str, Position]] = {}
        self._unnamed: dict[str, Position] | None = None  # version 1's positions, until a destination takes them
        try:
            if path.exists():
                stored = _decode(path.read_bytes())
                self._destinations = {Destination(shipped.cluster, shipped.topic): shipped.files
                                      for shipped in stored.destinations}
                self._unnamed = stored.files
        except OSError as error:
            raise CheckpointFileError(f"{path}: cannot read the shipper's checkpoints: {error.strerror or error}") from None
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise CheckpointFileError(f"{path}: not a shipper checkpoint file ({type(error).__name__}: {error}); move it "
                                  "away to ship the root again from the start (consumers skip the repeats)") from None
        self.positions: dict[str, Position] = {}
        self.refused: set[str] = set()  # the files whose reading was refused

    def ship_to(self, destination: Destination) -> str | None:
        """Take the positions of ``destination``; returns the line to say
        when they are not simply those it was left with."""
        said = None
        if destination not in self._destinations:
            if self._unnamed is not None:
                self._destinations[destination], self._unnamed = self._unnamed, None
                self.save()  # taken once: by this destination, whatever the next run ships to
                said = (f"{self.path}: checkpoints written before they named the cluster and topic are taken as "
                        f"those of {destination}")
            elif self._destinations:
                said = (f"nothing shipped to {destination} yet: shipping the root from the start (the checkpoints of "
                        f"{len(self._destinations)} other destination(s) are kept)")
            self._destinations.setdefault(destination, {})
        self.positions = self._destinations[destination]
        self.refused = {name for name, position in self.positions.items() if position.failed}
        return said

    def update(self, moved: dict[str, Position]) -> None:
        """Take the positions of the files that moved (save them with :meth:`save`)."""
        self.positions.update(moved)
        for name, position in moved.items():
            (self.refused.add if position.failed else self.refused.discard)(name)

    def save(self) -> None:
        temp = self.path.with_suffix(".tmp")
        stored = _Stored(version=2, destinations=[
            _Shipped(destination.cluster, destination.topic, dict(sorted(positions.items())))
            for destination, positions in sorted(self._destinations.items())], files=self._unnamed)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as stream:
                stream.write(_encode(stored))
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temp, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            raise CheckpointFileError(f"{self.path}: cannot write the shipper's checkpoints: "
                                  f"{error.strerror or error}") from None
