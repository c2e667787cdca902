"""Lay session logs out in dsh's directory layout, raw or zstd."""

from __future__ import annotations

from pathlib import Path

from dsh_core.jsonvalue import decode_json
from dsh_core.storage.framing import compress_frame
from dsh_core.storage.layout import log_path


def place(root: Path, log: bytes, compression: str) -> Path:
    """Write a raw log (header line + records) into ``root`` in dsh's layout;
    zstd puts the header in frame 1 and every 20 lines in a frame."""
    header = decode_json(log.split(b"\n", 1)[0])
    path = log_path(root, header.get("cwd"), header["id"], compression)
    path.parent.mkdir(parents=True, exist_ok=True)
    if compression == "zstd":
        lines = log.split(b"\n")
        body = [line + b"\n" for line in lines[1:] if line]
        frames = [compress_frame(lines[0] + b"\n")]
        frames += [compress_frame(b"".join(body[i:i + 20])) for i in range(0, len(body), 20)]
        path.write_bytes(b"".join(frames))
    else:
        path.write_bytes(log)
    return path


def storage_lines(log: bytes) -> list[bytes]:
    """The record lines of a raw log (complete lines only)."""
    return [line for line in log.split(b"\n")[1:] if line]
