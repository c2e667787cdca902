"""Who may write a session: the writer rules every consumer service applies
to a session's header and event records, before anything is applied.

A session's writer is the writer of the first header record it took
(``dsh-writer``, :func:`dsh_kafka.records.writer_of` its header). Refused
with :class:`ConflictingWriterError` (dead letter ``conflicting-writer``):

* a record tagged with another writer (:func:`~dsh_kafka.records.check_writer`);
* a second header differing from the first
  (:func:`~dsh_kafka.records.check_same_header`);
* an event record without a tag in a session whose header record carried
  one. Every producer of this project tags each header and event record it
  sends, so such a record is not the tagged writer's: it comes from another
  producer (one older than the tag), and its events cannot be told from
  the session's own by their content, since events do not carry their
  session id. Refusing it by name makes the services agree where only the
  projector's and auditor's folds would notice it (a v4 session with
  another session's events written into it, issue 35 class 12). Producers
  of one session must therefore all tag: a bridge older than the tag
  beside a newer shipper of the same live session sees its events refused
  (the shipper's copies of them apply).

Records of a session whose header record carried no tag (older producers)
are checked by their seqs' digests only (:mod:`.sequencing`), as they
always were, and so are those of a session whose header was taken before
header records were noted (its tag is unknown).

The header record's tag is kept with the session's applied digests (under
:data:`~.sequencing.HEADER_SEQ`), so a restarted service knows it.
"""

from __future__ import annotations

from dsh_core.errors import ConflictingWriterError
from dsh_core.formats import read_header
from dsh_core.session_header import SessionHeader
from dsh_kafka.records import KIND_RECORD, SessionRecord, check_identity, check_same_header, check_writer

from .sequencing import AppliedDigests

__all__ = ["accept_header", "check_session_writer"]


def check_session_writer(record: SessionRecord, header: SessionHeader | None, digests: AppliedDigests) -> None:
    """Refuse a header or event record of ``header``'s session (``None``
    before it took one) that is not its writer's, with
    :class:`ConflictingWriterError`."""
    check_writer(record, header)
    if header is None or record.writer or record.kind != KIND_RECORD:
        return
    tagged = digests.header_writer()
    if tagged:
        raise ConflictingWriterError(record.session_id, record.seq, f"an event record without dsh-writer, where the "
                                     f"session's header record carried writer {tagged[:64]!r}, whose producers tag "
                                     "every record")


def accept_header(record: SessionRecord, header: SessionHeader | None, digests: AppliedDigests
                  ) -> SessionHeader | None:
    """The header a session takes from a header ``record``, its writer
    checked first (:func:`check_session_writer`): ``None`` for a copy of
    the one it took (``header``); a differing one is refused
    (:func:`~dsh_kafka.records.check_same_header`), and so is a first one
    naming another session or holding a field of a type dsh never writes
    (:func:`~dsh_kafka.records.check_identity`). The record's tag is noted
    in ``digests``."""
    check_session_writer(record, header, digests)
    if header is not None:
        check_same_header(record, header)
        return None
    taken = read_header(record.value, f"session {record.session_id!r} header")
    check_identity(record, taken)
    digests.note_header(record.writer)
    return taken
