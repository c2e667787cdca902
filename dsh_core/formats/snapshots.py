"""The tagged snapshot layout: a layout line, then the fold's state as a
msgspec Struct tagged with its format, and the observer's analysis, as JSON.

:class:`TaggedSnapshots` is a :class:`~dsh_core.formats.contract.SnapshotCodec`
over the state types of the formats the registry gives it: a new format
whose fold saves a Struct tagged with its name joins the union, and no
module or class name is ever written. Layouts an earlier build wrote are
read by ``legacy`` readers (layouts 1 and 2 pickled: :mod:`.v3.pickled`)
and written again in the current layout by the next save.

Evolution: a new layout gets a new number; within a layout only msgspec's
compatible changes (a new field with a default); a blob of any other layout
is refused with :class:`FormatUnsupportedError`, never read by guesswork.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, TypeVar, Union

import msgspec

from ..analysis import AnalysisSnapshot
from ..errors import DecodeError, FormatUnsupportedError
from ..json_depth import STORED_DEPTH
from ..jsonvalue import decode_json, dump_json, float_hook
from .contract import SurfaceRows

__all__ = ["LegacyReader", "TaggedSnapshots", "read_struct"]

T = TypeVar("T")

#: Reads the body of a legacy layout: its saved state and analysis.
LegacyReader = Callable[[bytes, str, "SurfaceRows | None"], "tuple[Any, AnalysisSnapshot | None]"]


class TaggedSnapshots:
    """Snapshots behind ``magic % layout``: ``{"fold": state, "analysis": ...}``."""

    def __init__(self, magic: bytes, layout: int, states: tuple[type, ...],
                 legacy: Mapping[int, LegacyReader]) -> None:
        self.magic, self.layout, self.legacy = magic, layout, legacy
        self.header = magic % layout
        self._prefix = magic.split(b"%d")[0]
        self._legacy_headers = {magic % old: reader for old, reader in legacy.items()}

        # {"fold": one of the registry's tagged states, "analysis": ...}: a Struct made
        # here, whose fields no type checker sees
        self._saved: type[Any] = msgspec.defstruct("Saved", [("fold", Union[states]),
                                                             ("analysis", Optional[AnalysisSnapshot], None)],
                                                   frozen=True)
        self._decode = msgspec.json.Decoder(self._saved, float_hook=float_hook).decode

    def matches(self, blob: bytes) -> bool:
        return blob.startswith(self._prefix)

    def is_legacy(self, blob: bytes) -> bool:
        """Whether ``blob`` is of a layout an earlier build wrote."""
        return blob.startswith(tuple(self._legacy_headers))

    def write(self, state: Any, analysis: AnalysisSnapshot | None) -> bytes:
        return self.header + dump_json(self._saved(state, analysis))

    def read(self, blob: bytes, where: str,
             surface_events: SurfaceRows | None) -> tuple[Any, AnalysisSnapshot | None]:
        first, _, body = blob.partition(b"\n")
        reader = self._legacy_headers.get(first + b"\n")
        if reader is not None:
            return reader(body, where, surface_events)
        if first + b"\n" != self.header:
            raise FormatUnsupportedError(
                f"{where}: fold snapshot is {first.decode('ascii', 'replace')!r}, but this build reads only layouts "
                f"{', '.join(map(str, [*self.legacy, self.layout]))}")
        saved = read_struct(body, where, self._decode, self._saved)
        return saved.fold, saved.analysis


def read_struct(blob: bytes, where: str, decode: Callable[[bytes], T], kind: type[T],
                refuse: Callable[[Any, str], None] | None = None) -> T:
    """``blob`` as a ``kind``; payloads only :func:`decode_json` reads (lone
    surrogate escapes) take the slower way, where ``refuse`` may first name
    what the value is instead (say, another version). Raises :class:`DecodeError`."""
    try:
        return decode(blob)
    except msgspec.DecodeError:
        try:
            value = decode_json(blob, STORED_DEPTH)
        except DecodeError as exc:
            raise DecodeError(f"{where}: not a fold snapshot: {exc.message}") from None
        if refuse is not None:
            refuse(value, where)
        try:
            return msgspec.convert(value, kind)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"{where}: not a fold snapshot: {exc}") from None
