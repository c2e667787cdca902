"""``migrate``: a v3 log rewritten as the v4 log dsh 0.2.1 would make of it.

dsh 0.2.1 migrates an older log on its first write open: it publishes a new
``session.v4.jsonl.zstd`` beside the untouched source, a header frame and
one frame with every event. Its packaged 0.2.1rc2 binary cannot (its
migration worker is missing from the executable), so a session a 0.1.5
agent wrote cannot be continued by a 0.2.1rc2 agent. This writes that file
from the v3 log read as :class:`~dsh_core.v4.v3.V3Fold` reads it, refusing
a log it would refuse, and never replaces a file: the source stays, and an
existing v4 file is left alone. (v0 logs need dsh's v0→v1→v2→v3 chain,
which this build does not have.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import FormatUnsupportedError, PipelineError
from ..jsonvalue import encode_json
from ..storage.framing import compress_frame
from ..storage.layout import generation_of
from ..storage.reader import load_session
from .rows import encode_seq_ranges

__all__ = ["migrate_v3"]

_KEY_ORDER = ("type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable")


def _line(event: dict[str, Any]) -> bytes:
    out = {key: event[key] for key in _KEY_ORDER if key in event}
    if "sourceEventSeqs" in out:
        out["sourceEventSeqs"] = encode_seq_ranges(list(out["sourceEventSeqs"]))
    return encode_json(out)


def migrate_v3(source: str | os.PathLike[str]) -> Path:
    """Write ``session.v4.jsonl.zstd`` beside the v3 log ``source``; returns its path."""
    source = Path(source)
    if generation_of(source) != 3:
        raise FormatUnsupportedError(f"{source}: migrate takes a v3 log (session.v3.jsonl[.zstd]); this build has no "
                                     "migration from other formats")
    target = source.parent / "session.v4.jsonl.zstd"
    result = load_session(source, keep_migrated=True)
    if not result.accepted:
        raise result.error
    if result.migrated_events is None:
        raise FormatUnsupportedError(f"{source}: the file does not hold a v3 log")
    header = result.header.to_dict() | {"version": 4}
    body = (compress_frame(encode_json({"type": "session", **header}) + b"\n")
            + compress_frame(b"".join(_line(event) + b"\n" for event in result.migrated_events)))
    staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with open(staged, "wb") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(staged, target)  # publish without replacing what is there
    except FileExistsError:
        raise PipelineError(f"{target}: already exists; migrate never replaces a log") from None
    finally:
        staged.unlink()
    return target
