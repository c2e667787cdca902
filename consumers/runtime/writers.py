"""Who may write a session: the writer rules every consumer service applies
to a session's header and event records, before anything is applied.

Every producer of this project tags each header and event record it sends
with ``dsh-writer``, the digest of the session header its log starts with
(:func:`dsh_kafka.records.writer_of`). **A session's writer is the one its
records name first**: its header record's, or, where event records come
before any header (held until it comes), theirs. Refused with
:class:`ConflictingWriterError` (dead letter ``conflicting-writer``):

* a record naming another writer: another than the first one named, or
  than its header's (:func:`~dsh_kafka.records.check_writer`). Records of
  a second writer held before any header therefore never merge into the
  first's: the first named holds the session, and a header of another
  writer coming after them is refused (with every later record of that
  writer) — the session takes the header of the writer its held records
  named, and drains them then;
* a header naming no writer whose digest is not the writer named first;
* a second header differing from the first
  (:func:`~dsh_kafka.records.check_same_header`);
* an event record naming no writer, in a session whose records named one.
  It is not that writer's (its producers tag every record): it comes from
  another producer, one older than the tag, and its events cannot be told
  from the session's own by their content, since events do not carry
  their session id. Refusing it by name makes the services agree where
  only the projector's and auditor's folds would notice it (a v4 session
  with another session's events written into it). All of one session's
  producers must therefore tag: a bridge older than the tag beside a newer
  shipper of the same live session sees its events refused (the shipper's
  copies of them apply).

A session whose header record named no writer (older producers) is known
to have a second writer only by other bytes at a seq (:mod:`.sequencing`),
as it always was, and so is one that took its header before the writer
named first was noted (it is unknown).

Not caught: a second root continuing a byte-identical copy of a session
(a copied folder written in two places) names the same writer, so only
its records at seqs the first root also wrote, in the same framing and
other bytes, show it; its records past the first root's last seq apply.
Telling them apart needs a writer identity that follows content (each
record naming the digest of the events before it).

The writer named first is kept with the session's applied digests (under
:data:`~.sequencing.WRITER_SEQ`), so a restarted service knows it.
"""

from __future__ import annotations

from dsh_core.errors import ConflictingWriterError
from dsh_core.formats import read_header
from dsh_core.session_header import SessionHeader
from dsh_kafka.records import (KIND_RECORD, SessionRecord, check_identity, check_same_header, check_writer,
                               writer_of)

from .sequencing import AppliedDigests

__all__ = ["accept_header", "check_session_writer", "take_header"]


def check_session_writer(record: SessionRecord, header: SessionHeader | None, digests: AppliedDigests) -> None:
    """Refuse a header or event record of a session (``header``: the one it
    took, ``None`` before) that is not its writer's, with
    :class:`ConflictingWriterError`; the first record naming a writer
    before any header names the session's."""
    check_writer(record, header)
    if record.writer and header is not None:
        return  # its header's writer (check_writer), which is the one named first
    named = digests.writer()
    if record.writer:
        if named and record.writer != named:
            raise ConflictingWriterError(record.session_id, record.seq, f"a {record.kind} of writer "
                                         f"{record.writer[:64]!r}, where the session's records named writer "
                                         f"{named!r} first")
        if named is None:
            digests.note_writer(record.writer)
    elif named and record.kind == KIND_RECORD:
        raise ConflictingWriterError(record.session_id, record.seq, "an event record naming no writer "
                                     f"(dsh-writer), where the session's records named writer {named!r}, whose "
                                     "producers tag every record")


def take_header(record: SessionRecord, header: SessionHeader, digests: AppliedDigests) -> None:
    """Before a session takes ``header`` (from ``record``, checked by
    :func:`check_session_writer`): refuse it if it is not the writer's its
    records named first (a header naming no writer), and note the record's
    writer where none was named."""
    named = digests.writer()
    if named and writer_of(header) != named:
        raise ConflictingWriterError(record.session_id, record.seq, f"a header of writer {writer_of(header)!r} "
                                     f"(its digest), where the session's records named writer {named!r} first")
    if named is None:
        digests.note_writer(record.writer)


def accept_header(record: SessionRecord, header: SessionHeader | None, digests: AppliedDigests
                  ) -> SessionHeader | None:
    """The header a session takes from a header ``record``, its writer
    checked first (:func:`check_session_writer`): ``None`` for a copy of
    the one it took (``header``); a differing one is refused
    (:func:`~dsh_kafka.records.check_same_header`), and so is a first one
    naming another session or holding a field of a type dsh never writes
    (:func:`~dsh_kafka.records.check_identity`) or of another writer than
    its records named first (:func:`take_header`)."""
    check_session_writer(record, header, digests)
    if header is not None:
        check_same_header(record, header)
        return None
    taken = read_header(record.value, f"session {record.session_id!r} header")
    check_identity(record, taken)
    take_header(record, taken, digests)
    return taken
