"""The writer rules of every service (consumers/runtime/writers.py): the
writer a session's records name first is its writer; an event record
without ``dsh-writer`` in a session whose records named one, and a record
of another writer, are a conflicting writer's, in the projector, the
auditor and the archiver alike, and still after a restart; sessions whose
header record was untagged (older producers) take untagged records as
before."""

from __future__ import annotations

import json

import msgspec
import pytest

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.projector import Projection, ProjectorConfig
from consumers.runtime.sequencing import WRITER_SEQ, AppliedDigests
from consumers.runtime.writers import accept_header, check_session_writer
from dsh_core.errors import ConflictingWriterError
from dsh_core.formats import read_header
from dsh_core.loader import read_events
from dsh_core.storage.layout import find_session_files
from dsh_kafka.records import KIND_RECORD, SessionRecord
from producers.simulator import SimulatorConfig, simulate_session
from tests.policy_driver import KAFKA, NAMES, fetched, run_batch


def _sessions(formats: tuple[int, ...], seed: int) -> list[list[SessionRecord]]:
    config = SimulatorConfig(sessions=len(formats), seed=seed, min_turns=2, max_turns=2, big_result_probability=0,
                             formats=formats)
    return [[record for batch in simulate_session(config, index)[1] for record in batch]
            for index in range(config.sessions)]


def _untagged(record: SessionRecord) -> SessionRecord:
    return msgspec.structs.replace(record, writer="")


def _policies(tmp_path):
    return [Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
            Audit(AuditorConfig(kafka=KAFKA, state=tmp_path / "auditor.sqlite", checkpoint_seconds=0)),
            Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]


def test_an_untagged_event_record_is_refused_only_where_the_header_record_carried_a_writer():
    header_record, event, *_ = _sessions((4,), seed=3)[0]
    header = read_header(header_record.value, "test")
    tagged, old, unknown = (AppliedDigests(header.id) for _ in range(3))
    tagged.note_writer(header_record.writer)
    old.note_writer("")
    with pytest.raises(ConflictingWriterError, match=r"an event record naming no writer \(dsh-writer\), where the "
                                                     r"session's records named writer '[0-9a-f]{32}'"):
        check_session_writer(_untagged(event), header, tagged)
    check_session_writer(event, header, tagged)  # its own writer's
    check_session_writer(_untagged(header_record), header, tagged)  # a copy of the header says nothing new
    check_session_writer(_untagged(event), header, old)  # an older producer's session: seq digests only
    check_session_writer(_untagged(event), header, unknown)  # its header taken before writers were noted
    check_session_writer(event, header, unknown)
    assert unknown.writer() is None  # (a tagged record after the header notes nothing)
    assert tagged.changes()[WRITER_SEQ] == (0, header_record.writer.encode())
    assert AppliedDigests(header.id, {WRITER_SEQ: (0, header_record.writer.encode())}.get).writer() == \
        header_record.writer  # as a restarted service reads it from its store


def test_a_header_record_is_taken_once_and_a_differing_one_is_a_conflicting_writer():
    (first, *_), (other, *_) = _sessions((4, 4), seed=4)
    digests = AppliedDigests(first.session_id)
    header = accept_header(first, None, digests)
    assert header is not None and header.id == first.session_id and digests.writer() == first.writer
    assert accept_header(first, header, digests) is None  # a copy
    renamed = SessionRecord(first.session_id, first.kind, 0, 0,
                            other.value.replace(other.session_id.encode(), first.session_id.encode()), 4)
    with pytest.raises(ConflictingWriterError, match="a second header differing from the first"):
        accept_header(renamed, header, digests)


def test_another_sessions_untagged_events_in_a_tagged_v4_session_are_refused_alike_and_after_a_restart(tmp_path):
    session, other, honest = _sessions((4, 4, 4), seed=5)
    victim = session[0].session_id
    cut = len(session) // 2
    next_seq = session[cut].seq
    foreign = [SessionRecord(victim, KIND_RECORD, next_seq + offset, 1,
                             json.dumps(json.loads(record.value) | {"seq": next_seq + offset}).encode(), 4)
               for offset, record in enumerate(other[3:6])]
    first_foreign = len(honest) + cut
    stream = honest + session[:cut] + foreign + session[cut:]

    for policy in _policies(tmp_path):
        outputs = run_batch(policy, fetched(stream))
        letters = [(int(headers["dsh-dlq-offset"]), headers["dsh-dlq-reason"])
                   for _, _, headers in outputs.on(NAMES.dead_letter)]
        assert letters == [(offset, b"conflicting-writer")
                           for offset in range(first_foreign, first_foreign + len(foreign))], policy.name
        if policy.name == "auditor":
            found = [json.loads(value) for _, value, _ in outputs.on(NAMES.findings)]
            assert [(f["rule"], f["session"], f["seq"]) for f in found] == [
                ("conflicting-writer", victim, next_seq)], found
    [archived] = [path for path in find_session_files(tmp_path / "archive") if victim in str(path)]
    assert read_events(archived)[1] == [json.loads(r.value) for r in session if r.kind == KIND_RECORD]

    # Restarted on their stores, the session's header record is known to have been tagged.
    late = SessionRecord(victim, KIND_RECORD, session[-1].seq + 1, 1,
                         json.dumps(json.loads(other[6].value) | {"seq": session[-1].seq + 1}).encode(), 4)
    for policy in _policies(tmp_path):
        outputs = run_batch(policy, fetched([late]))
        assert [headers["dsh-dlq-reason"] for _, _, headers in outputs.on(NAMES.dead_letter)] == [
            b"conflicting-writer"], policy.name
    assert read_events(archived)[1] == [json.loads(r.value) for r in session if r.kind == KIND_RECORD]


def test_a_session_whose_producers_never_tagged_is_taken_as_before(tmp_path):
    session = [_untagged(record) for record in _sessions((4,), seed=6)[0]]
    for policy in _policies(tmp_path):
        assert run_batch(policy, fetched(session)).on(NAMES.dead_letter) == [], policy.name


def test_the_first_record_naming_a_writer_names_the_sessions_even_before_its_header():
    (first_header, first_event, *_), (other_header, *_) = _sessions((4, 4), seed=7)
    digests = AppliedDigests(first_header.session_id)
    check_session_writer(first_event, None, digests)  # held before any header: it names the writer
    assert digests.writer() == first_event.writer
    renamed = SessionRecord(first_header.session_id, other_header.kind, 0, 0,
                            other_header.value.replace(other_header.session_id.encode(),
                                                       first_header.session_id.encode()), 4)
    with pytest.raises(ConflictingWriterError, match=r"a header of writer '[0-9a-f]{32}' \(its digest\), where the "
                                                     "session's records named writer"):
        accept_header(renamed, None, digests)  # untagged, another header
    tagged = msgspec.structs.replace(renamed, writer="f" * 32)
    with pytest.raises(ConflictingWriterError, match="a header of writer 'f{32}', where the session's records "
                                                     "named writer"):
        accept_header(tagged, None, digests)
    assert accept_header(first_header, None, digests) is not None  # its own header
    assert accept_header(_untagged(first_header), None, AppliedDigests("x", {}.get)) is not None
