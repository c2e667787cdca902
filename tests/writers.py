"""Two writers of one session: another log's records under a session's id,
tagged with the writer of their own header (as its shipper tags them)."""

from __future__ import annotations

from dsh_core.formats import read_header
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord, writer_of


def second_writer(first: list[SessionRecord], other: list[SessionRecord]) -> list[SessionRecord]:
    """``other``'s records as a second writer of ``first``'s session."""
    session_id, renamed = first[0].session_id, other[0].session_id
    header = next(r for r in other if r.kind == KIND_HEADER)
    writer = writer_of(read_header(header.value.replace(renamed.encode(), session_id.encode()), "second writer"))
    return [SessionRecord(session_id, r.kind, r.seq, r.count, r.value.replace(renamed.encode(), session_id.encode()),
                          r.format_version, writer if r.kind in (KIND_HEADER, KIND_RECORD) else "") for r in other]
