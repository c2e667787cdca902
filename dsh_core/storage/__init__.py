"""dsh's on-disk session format: JSONL records, packed chunk rows, zstd
frames, the directory layout and the framing readers and writer. What the
records mean is each format's (:mod:`dsh_core.formats`); loading a file is
:mod:`dsh_core.loader`."""

from .layout import encode_segment, find_session_files, log_path, project_key
from .reader import LoadResult
from .records import ChunkRow, decode_row, encode_records, pack_chunk_runs
from .writer import SessionFileWriter, commit_repair, encode_batch

__all__ = [
    "ChunkRow", "LoadResult", "SessionFileWriter", "commit_repair", "decode_row", "encode_batch", "encode_records",
    "encode_segment", "find_session_files", "log_path", "pack_chunk_runs", "project_key",
]
