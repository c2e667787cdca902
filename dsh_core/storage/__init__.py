"""dsh's on-disk session format: JSONL records, packed chunk rows, zstd
frames, the directory layout, legacy upgrades, crash repair."""

from .layout import encode_segment, find_session_files, log_path, project_key
from .reader import LoadResult, load_session, load_session_bytes
from .records import ChunkRow, decode_row, encode_records, pack_chunk_runs
from .repair import interrupted_turn_closers
from .writer import SessionFileWriter, commit_repair, encode_batch

__all__ = [
    "ChunkRow", "LoadResult", "SessionFileWriter", "commit_repair", "decode_row", "encode_batch",
    "encode_records", "encode_segment", "find_session_files", "interrupted_turn_closers", "load_session",
    "load_session_bytes", "log_path", "pack_chunk_runs", "project_key",
]
