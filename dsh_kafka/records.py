"""The record envelope of ``dsh.session-events`` (docs/reference/topics.md).

Key: the session id (UTF-8). Value: self-describing JSON; for ``record``
the exact JSONL line of one dsh storage record (an event or a packed chunk
row), for ``header`` the session header line, for ``attestation`` a request
attestation. Headers: ``dsh-kind``, ``dsh-seq`` (first seq carried),
``dsh-count`` (events carried), ``dsh-format`` (session format version),
and on header and event records ``dsh-writer``: the writer of the session,
the digest of its header (:func:`writer_of`), the same for every producer
of one log whatever its framing. A record of a session whose header has
another writer is a second writer's (:func:`check_writer`).
A ``deletion`` record (value ``{"deletedAt": ms}``, seq and count 0) is
the fence ``delete-session`` puts after every record of a session: each
service forgets the session there and takes none of its later records.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

import msgspec

from dsh_core.errors import (ConflictingWriterError, DecodeError, DshError, IdentityError, SessionHeaderError,
                             SessionIdError)
from dsh_core.events import ROW_TAGS, Event, is_row
from dsh_core.jsonvalue import MAX_SAFE_INTEGER, decode_json, encode_json
from dsh_core.request import DIGEST_ALGORITHM
from dsh_core.formats import read_header
from dsh_core.session_header import FORMAT_VERSION, SessionHeader
from dsh_core.storage.records import decode_row, pack_chunk_runs

from .topics import MAX_MESSAGE_BYTES

__all__ = ["KIND_HEADER", "KIND_RECORD", "KIND_ATTESTATION", "KIND_WIRE", "KIND_DELETION", "SessionRecord",
           "KafkaRecord", "deletion_record",
           "Attestation", "record_from_line", "records_for_batch", "header_record", "attestation_record",
           "wire_attestation_record", "check_envelope", "check_format", "check_identity", "check_same_header",
           "check_writer", "decode_kafka_record", "where_of", "writer_of"]

KIND_HEADER = "header"
KIND_RECORD = "record"
KIND_ATTESTATION = "attestation"
KIND_WIRE = "wire-attestation"
KIND_DELETION = "deletion"
_KINDS = frozenset({KIND_HEADER, KIND_RECORD, KIND_ATTESTATION, KIND_WIRE, KIND_DELETION})


#: The optional header fields of text dsh writes (the stores keep them;
#: ``createdAt`` and ``delegationDepth`` are checked as the header is read).
_HEADER_TEXT_FIELDS = ("cwd", "parentSession", "origin", "agentPreset")


class KafkaRecord(Protocol):
    """What the consumer side needs of a fetched record (aiokafka's fits)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]  # Kafka allows a null header value
    timestamp: int  # ms since the epoch (the producer's CreateTime)


def where_of(record: KafkaRecord) -> str:
    """``topic[partition]@offset``."""
    return f"{record.topic}[{record.partition}]@{record.offset}"


class SessionRecord(msgspec.Struct, frozen=True):
    """One record of the events topic, before or after Kafka (a Struct:
    consumers build one per fetched record)."""

    session_id: str
    kind: str
    seq: int
    count: int
    value: bytes
    format_version: int = FORMAT_VERSION
    writer: str = ""  # the session's writer (writer_of its header); "" where not known (older producers)

    @property
    def key(self) -> bytes:
        return self.session_id.encode("utf-8")

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        headers = [("dsh-kind", self.kind.encode()), ("dsh-seq", str(self.seq).encode()),
                   ("dsh-count", str(self.count).encode()), ("dsh-format", str(self.format_version).encode())]
        return headers + [("dsh-writer", self.writer.encode())] if self.writer else headers

    @property
    def size(self) -> int:
        """Bytes Kafka counts against the message limit (key, value, headers)."""
        return len(self.key) + len(self.value) + sum(len(k) + len(v) for k, v in self.headers)


@dataclass(frozen=True)
class Attestation:
    """A request attestation: the digest of the request a worker sent."""

    turn: Any
    step: Any
    boundary_seq: int
    digest: str
    algorithm: str = DIGEST_ALGORITHM

    def to_json(self) -> bytes:
        return encode_json({"turn": self.turn, "step": self.step, "boundarySeq": self.boundary_seq,
                            "algorithm": self.algorithm, "digest": self.digest})


def writer_of(header: SessionHeader) -> str:
    """The writer of a session: the sha256 of its header as dsh writes it
    (:meth:`SessionHeader.to_line`), 32 hex digits. Every producer of one log
    (shipper, bridges, publisher) gives its records the same writer; a log
    of another header, under the same session id, is another writer's."""
    try:
        return _known_writer(header)
    except TypeError:  # a field of a type dsh never writes (a list for a text), so not hashable: not remembered
        return _writer(header)


def _writer(header: SessionHeader) -> str:
    return hashlib.sha256(header.to_line()).hexdigest()[:32]


#: Consumers ask for the writer of a session's header with each of its records.
_known_writer = functools.lru_cache(maxsize=4096)(_writer)


def record_from_line(session_id: str, line: bytes, format_version: int = FORMAT_VERSION,
                     writer: str = "") -> SessionRecord:
    """The record of one stored JSONL line of a session of ``format_version``,
    its bytes unchanged. Raises :class:`DecodeError` for a line that is no
    storage record."""
    value = decode_json(line)
    if is_row(value):
        row = decode_row(value)
        return SessionRecord(session_id, KIND_RECORD, row.seq0, row.event_count, line, format_version, writer)
    seq = value.get("seq") if isinstance(value, dict) else None
    if type(seq) is not int or seq < 0:
        raise DecodeError(f"session {session_id!r}: a storage record needs a non-negative integer seq, got {seq!r}")
    return SessionRecord(session_id, KIND_RECORD, seq, 1, line, format_version, writer)


def check_envelope(record: SessionRecord) -> None:
    """A record's ``dsh-seq`` and ``dsh-count`` are those of its value, which
    is one storage line; raises :class:`DecodeError` otherwise."""
    stored = record_from_line(record.session_id, record.value)
    if (stored.seq, stored.count) != (record.seq, record.count):
        raise DecodeError(f"session {record.session_id!r}: the envelope says seq {record.seq} count {record.count}, "
                          f"its value holds seq {stored.seq} count {stored.count}")


def records_for_batch(session_id: str, events: Iterable[Event | dict[str, Any]], pack: bool = True,
                      writer: str = "") -> list[SessionRecord]:
    """Records of one append batch: delta runs packed as dsh stores them."""
    dicts = [e.to_dict() if isinstance(e, Event) else e for e in events]
    out = []
    for record in (pack_chunk_runs(dicts) if pack else dicts):
        if record["type"] in ROW_TAGS:
            members = record["data"]["texts" if "texts" in record["data"] else "args"]
            out.append(SessionRecord(session_id, KIND_RECORD, record["seq0"], len(members), encode_json(record),
                                     writer=writer))
        else:
            out.append(SessionRecord(session_id, KIND_RECORD, record["seq"], 1, encode_json(record), writer=writer))
    return out


def header_record(header: SessionHeader) -> SessionRecord:
    return SessionRecord(header.id, KIND_HEADER, 0, 0, header.to_line(), header.version, writer_of(header))


def attestation_record(session_id: str, attestation: Attestation) -> SessionRecord:
    return SessionRecord(session_id, KIND_ATTESTATION, attestation.boundary_seq, 0, attestation.to_json())


def wire_attestation_record(session_id: str, arrival: int, value: bytes) -> SessionRecord:
    """A gateway's attestation of the ``arrival``-th request of a session it
    forwarded (``dsh-seq`` = arrival; see :mod:`producers.gateway`)."""
    return SessionRecord(session_id, KIND_WIRE, arrival, 0, value)


def deletion_record(session_id: str, deleted_at: int) -> SessionRecord:
    """The fence after every record of a deleted session."""
    return SessionRecord(session_id, KIND_DELETION, 0, 0, encode_json({"deletedAt": deleted_at}))


def decode_kafka_record(record: KafkaRecord) -> SessionRecord:
    """Check a fetched record's envelope; raises :class:`DecodeError` naming
    ``topic[partition]@offset`` and what is wrong."""
    try:  # the well-formed record, checked without building anything else
        headers = {name: value for name, value in record.headers if value is not None}
        kind = headers["dsh-kind"].decode()
        seq, count = int(headers["dsh-seq"]), int(headers["dsh-count"])
        if (kind in _KINDS and record.key and b"\x00" not in record.key and record.value is not None
                and 0 <= seq <= MAX_SAFE_INTEGER
                and 0 <= count <= MAX_SAFE_INTEGER and len(record.value) <= MAX_MESSAGE_BYTES):
            writer = headers.get("dsh-writer")  # absent from older producers' records
            return SessionRecord(record.key.decode("utf-8"), kind, seq, count, record.value,
                                 int(headers["dsh-format"]), writer.decode("utf-8", "replace") if writer else "")
    except (KeyError, ValueError, TypeError, AttributeError):
        pass
    raise _envelope_error(record)


def _envelope_error(record: KafkaRecord) -> DecodeError:
    """What is wrong with a record :func:`decode_kafka_record` refused."""
    where = where_of(record)
    if not record.key:
        return DecodeError(f"{where}: record has no key (the session id)")
    try:
        session_id = record.key.decode("utf-8")
    except UnicodeDecodeError:
        return DecodeError(f"{where}: key is not UTF-8")
    if "\x00" in session_id:
        return SessionIdError(f"{where}: key {session_id!r} holds NUL, which no session id holds (no dsh session "
                              "folder, file name or PostgreSQL text can)")
    headers = dict(record.headers or ())
    fields = {}
    for name in ("dsh-kind", "dsh-seq", "dsh-count", "dsh-format"):
        if name not in headers:
            return DecodeError(f"{where}: header {name} is missing")
        value = headers[name]
        if value is None:
            return DecodeError(f"{where}: header {name} is null")
        fields[name] = value.decode("utf-8", "replace")
    kind = fields["dsh-kind"]
    if kind not in _KINDS:
        return DecodeError(f"{where}: dsh-kind {kind!r} is not one of {sorted(_KINDS)}")
    try:
        numbers = [int(fields[name]) for name in ("dsh-seq", "dsh-count", "dsh-format")]
    except ValueError:
        return DecodeError(f"{where}: dsh-seq/dsh-count/dsh-format must be integers, got {fields}")
    if min(numbers[:2]) < 0 or max(numbers[:2]) > MAX_SAFE_INTEGER:
        return DecodeError(f"{where}: dsh-seq and dsh-count must be safe integers from 0 to 2^53-1, got {fields}")
    if record.value is None:
        return DecodeError(f"{where}: record has no value")
    if len(record.value) > MAX_MESSAGE_BYTES:
        return DecodeError(f"{where}: a {len(record.value)}-byte value (after decompression) is over the "
                           f"{MAX_MESSAGE_BYTES}-byte record limit")
    return DecodeError(f"{where}: the record envelope cannot be read")


def check_same_header(record: SessionRecord, header: SessionHeader) -> None:
    """A header record for a session that already has ``header`` is a copy
    of it; a different one (two writers, or two sessions of one id) is
    refused with :class:`ConflictingWriterError`."""
    try:
        again = read_header(record.value, f"session {record.session_id!r} header")
    except DshError as error:
        raise IdentityError(f"session {record.session_id!r}: a second header that is not one ({error.message})") \
            from None
    if again.to_dict() != header.to_dict():
        raise ConflictingWriterError(record.session_id, record.seq, "a second header differing from the first "
                                     f"({_differences(header, again)})")


def check_writer(record: SessionRecord, header: SessionHeader | None) -> None:
    """A record tagged with another writer than that of the session's
    header (``header``: the first the session took) is a second writer's:
    refused with :class:`ConflictingWriterError`. Untagged records (older
    producers) and records before any header are not checked here; their
    seqs' digests still are (:mod:`consumers.runtime.sequencing`)."""
    if record.writer and header is not None and record.writer != writer_of(header):
        raise ConflictingWriterError(record.session_id, record.seq, f"a {record.kind} of writer {record.writer[:64]!r}, "
                                     f"where writer {writer_of(header)!r} wrote the session's header first")


def _differences(first: SessionHeader, second: SessionHeader) -> str:
    one, two = first.to_dict(), second.to_dict()
    return ", ".join(f"{key}: {one.get(key)!r} then {two.get(key)!r}" for key in sorted(one.keys() | two.keys())
                     if one.get(key) != two.get(key))


def check_identity(record: SessionRecord, header: SessionHeader) -> None:
    """The key is a record's identity: a header naming another session is
    refused with :class:`IdentityError`; one whose ``dsh-format`` is not its
    version, with :class:`DecodeError`; one with a field of another type
    than dsh gives it, with :class:`SessionHeaderError`."""
    if header.id != record.session_id:
        raise IdentityError(f"session {record.session_id!r}: the header in the value names session {header.id!r}; "
                            "the record key is the session's identity")
    check_format(record, header)
    for name in _HEADER_TEXT_FIELDS:
        value = getattr(header, name)
        if value is not msgspec.UNSET and type(value) is not str:
            raise SessionHeaderError(f"session {record.session_id!r} header: {name} must be a string, got "
                                     f"{'null' if value is None else type(value).__name__}")
    seed = header.seedLength
    if seed is not msgspec.UNSET and not (type(seed) is int and 0 <= seed <= MAX_SAFE_INTEGER):
        raise SessionHeaderError(f"session {record.session_id!r} header: seedLength must be a safe integer from 0 "
                                 "to 2^53-1")


def check_format(record: SessionRecord, header: SessionHeader | None) -> None:
    """A record's ``dsh-format`` is its session header's version (unchecked
    while the header is not known); raises :class:`DecodeError`."""
    if header is not None and record.format_version != header.version:
        raise DecodeError(f"session {record.session_id!r}: a {record.kind} at seq {record.seq} says dsh-format "
                          f"{record.format_version}, but the session's header is format v{header.version}")
