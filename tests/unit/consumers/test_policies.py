"""The three services' policies without a broker: records in, views,
archive files, findings and dead letters out (into recording outputs)."""

from __future__ import annotations

import json
import re

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.projector import Projection, ProjectorConfig, ViewStore
from dsh_core.storage.layout import find_session_files
from dsh_core.loader import load_session
from dsh_kafka.records import KIND_ATTESTATION, KIND_HEADER, KIND_RECORD, SessionRecord
from producers.simulator import SimulatorConfig, messages_digest, simulate_session
from tests.policy_driver import KAFKA, NAMES, Fetched, RecordingOutputs, fetched, run_batch


def _session(seed: int, index: int = 0):
    truth, batches = simulate_session(SimulatorConfig(sessions=1, seed=seed, min_turns=3, max_turns=3), index)
    return truth, [r for batch in batches for r in batch]


def _shuffled(records: list[SessionRecord]) -> list[SessionRecord]:
    """The header last, one record late, and a copy of another."""
    header = [r for r in records if r.kind == KIND_HEADER]
    rest = [r for r in records if r.kind != KIND_HEADER]
    late = next(r for r in rest if r.kind == KIND_RECORD and r.seq > 5)
    rest.remove(late)
    return rest[:4] + rest[2:3] + rest[4:] + [late] + header


def test_the_projection_folds_records_in_seq_order_and_queues_heads(tmp_path):
    truth, records = _session(seed=41)
    config = ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite", hot_sessions=1)
    outputs = run_batch(Projection(config), fetched(_shuffled(records)))
    store = ViewStore(config.store)
    try:
        view = store.view(truth.session_id)
    finally:
        store.close()
    assert (view["status"], view["nextSeq"], view["messagesDigest"]) == ("idle", truth.next_seq, truth.messages_digest)
    heads = outputs.on(NAMES.views)
    assert [(key, json.loads(value)["seq"]) for key, value, _ in heads] == [(truth.session_id.encode(), truth.next_seq)]
    assert outputs.on(NAMES.dead_letter) == []


def test_a_refused_record_is_dead_lettered_with_its_reason_and_place(tmp_path):
    truth, records = _session(seed=42)
    broken = SessionRecord(truth.session_id, KIND_RECORD, records[3].seq, 1, b'{"seq": "not an event"',
                           writer=records[0].writer)
    config = ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")
    outputs = run_batch(Projection(config), fetched(records[:3] + [broken]))
    [(key, value, headers)] = outputs.on(NAMES.dead_letter)
    assert (key, value) == (broken.key, broken.value)
    assert (headers["dsh-dlq-service"], headers["dsh-dlq-reason"], headers["dsh-dlq-offset"]) == (
        b"test", b"corrupt-storage", b"3")
    assert headers["dsh-dlq-error"].startswith(b"DecodeError: ")


def test_the_archive_is_the_shipped_log_whatever_the_arrival_order(tmp_path):
    truth, records = _session(seed=43)
    config = ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive")
    run_batch(Archive(config), fetched(_shuffled(records)))
    [path] = find_session_files(config.root)
    result = load_session(path)
    assert result.accepted and result.stored_count == truth.next_seq
    assert messages_digest(result.state.messages()) == truth.messages_digest


def test_the_audit_reports_a_missing_header_once_and_heals_when_it_comes(tmp_path):
    truth, records = _session(seed=44)
    header = next(r for r in records if r.kind == KIND_HEADER)
    policy = Audit(AuditorConfig(kafka=KAFKA))
    outputs = run_batch(policy, fetched([r for r in records if r is not header] + [header]))
    findings = [json.loads(value) for _, value, _ in outputs.on(NAMES.findings)]
    assert [(f["rule"], f["session"], f["seq"], f["category"]) for f in findings] == [
        ("sequence-gap", truth.session_id, 0, "corrupt-storage")]
    assert "the session header is missing" in findings[0]["detail"]
    healed = policy.sessions.get(truth.session_id)
    assert healed.fold.count == truth.next_seq and not healed.held and healed.gap_reported is None


def test_services_are_built_outside_an_event_loop_and_connect_only_whenrun_batch(tmp_path):
    from consumers.archiver import archiver_service
    from consumers.auditor import auditor_service
    from consumers.projector import projector_service
    services = [projector_service(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                auditor_service(AuditorConfig(kafka=KAFKA)),
                archiver_service(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]
    assert [service.name for service in services] == ["projector", "auditor", "archiver"]
    assert [service.config.group for service in services] == ["dsh-projector", "dsh-auditor", "dsh-archiver"]
    assert not (tmp_path / "views.sqlite").exists() and not (tmp_path / "archive").exists()


def _forged_header(truth, records) -> SessionRecord:
    """A header record keyed for ``truth``'s session whose value names another."""
    header = next(r for r in records if r.kind == KIND_HEADER)
    value = json.loads(header.value)
    value["id"] = "victim-session"
    return SessionRecord(truth.session_id, KIND_HEADER, 0, 0, json.dumps(value).encode())


def _reasons(outputs: RecordingOutputs) -> list[bytes]:
    return [headers["dsh-dlq-reason"] for _, _, headers in outputs.on(NAMES.dead_letter)]


def test_a_header_naming_another_session_is_refused_by_every_service(tmp_path):
    truth, records = _session(seed=45)
    forged = _forged_header(truth, records)
    policies = [Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                Audit(AuditorConfig(kafka=KAFKA)), Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]
    for policy in policies:
        outputs = run_batch(policy, fetched([forged] + records))
        assert _reasons(outputs) == [b"identity"], policy.name
    [path] = find_session_files(tmp_path / "archive")  # the real session's file only, under its own id
    assert path.parent.name == truth.session_id and load_session(path).stored_count == truth.next_seq


def test_envelope_numbers_beyond_safe_integers_are_refused_not_stored(tmp_path):
    truth, records = _session(seed=46)
    huge = Fetched(truth.session_id.encode(), records[1].value,
                    [("dsh-kind", b"record"), ("dsh-seq", str(2**63).encode()), ("dsh-count", b"1"),
                     ("dsh-format", b"0")], offset=len(records))
    outputs = run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                   fetched(records) + [huge])
    [(_, _, headers)] = outputs.on(NAMES.dead_letter)
    assert headers["dsh-dlq-reason"] == b"corrupt-storage"
    assert b"must be safe integers from 0 to 2^53-1" in headers["dsh-dlq-error"]


def test_an_unexpected_failure_dead_letters_the_record_and_the_service_goes_on(tmp_path):
    first, first_records = _session(seed=47, index=0)
    second, second_records = _session(seed=47, index=1)

    class Buggy(Projection):
        def handle(self, record, decoded):
            if decoded.session_id == first.session_id and decoded.seq == 3:
                raise KeyError("a bug")
            super().handle(record, decoded)

    config = ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")
    outputs = run_batch(Buggy(config), fetched(first_records + second_records))
    [(key, _, headers)] = outputs.on(NAMES.dead_letter)
    assert (key, headers["dsh-dlq-reason"]) == (first.session_id.encode(), b"internal")
    assert headers["dsh-dlq-error"].startswith(b"InternalError: dsh.session-events[0]@") and b"KeyError" in \
        headers["dsh-dlq-error"]
    store = ViewStore(config.store)
    try:
        assert store.view(first.session_id)["status"] == "refused"  # its state is not trusted any more
        assert store.view(second.session_id)["messagesDigest"] == second.messages_digest
    finally:
        store.close()


def test_an_attestation_that_is_not_an_object_is_dead_lettered():
    truth, records = _session(seed=48)
    attestation = next(r for r in records if r.kind == "attestation")
    bad = SessionRecord(truth.session_id, "attestation", attestation.seq, 0, b"[1, 2]")
    policy = Audit(AuditorConfig(kafka=KAFKA))
    outputs = run_batch(policy, fetched([r if r is not attestation else bad for r in records]))
    assert _reasons(outputs) == [b"corrupt-storage"]
    assert policy.sessions.get(truth.session_id).fold.count == truth.next_seq


def test_an_oversized_dead_letter_is_cut_with_its_size_and_digest():
    from consumers.runtime.outputs import DEAD_LETTER_VALUE_BYTES, dead_letter
    from dsh_core.errors import DecodeError
    value = b"x" * (DEAD_LETTER_VALUE_BYTES + 10)
    record = Fetched(b"s", value, [("big", b"y" * 20_000)], offset=7)
    cut, headers = dead_letter(record, DecodeError("too big"), "projector")
    named = dict(headers)
    assert len(cut) == DEAD_LETTER_VALUE_BYTES and "big" not in named
    assert (named["dsh-dlq-value-size"], named["dsh-dlq-headers-left-out"]) == (
        str(len(value)).encode(), b"20003")
    assert len(named["dsh-dlq-value-sha256"]) == 64 and named["dsh-dlq-offset"] == b"7"


def test_a_record_with_null_headers_is_dead_lettered_with_them_by_every_service(tmp_path):
    """Kafka allows a null header value: the envelope names it and the dead
    letter keeps it null."""
    headers = [("dsh-kind", b"record"), ("dsh-seq", None), ("dsh-count", b"1"), ("dsh-format", b"0"), ("x", None)]
    for policy in (Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                   Audit(AuditorConfig(kafka=KAFKA)), Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "a"))):
        [(key, value, letter)] = run_batch(policy, [Fetched(b"s-1", b"{}", headers, 3)]).on(NAMES.dead_letter)
        assert (key, value, letter["dsh-dlq-reason"], letter["dsh-seq"], letter["x"]) == (
            b"s-1", b"{}", b"corrupt-storage", None, None)
        assert letter["dsh-dlq-error"] == b"DecodeError: dsh.session-events[0]@3: header dsh-seq is null"


def test_label_values_from_log_content_are_bounded():
    from consumers.runtime.metrics import LabelValues
    labels = LabelValues(2)
    assert [labels(v) for v in ("a", "b", "c", "a", "\ud800x" * 80)] == ["a", "b", "other", "a", "other"]
    assert LabelValues(5)("\ud800") == "?"


def test_the_archive_takes_only_values_that_are_what_their_envelope_says(tmp_path):
    truth, records = _session(seed=49)
    event = next(r for r in records if r.kind == KIND_RECORD and r.count == 1 and r.seq > 3)
    liars = [SessionRecord(truth.session_id, KIND_RECORD, event.seq, 10**9, event.value, writer=event.writer),
             SessionRecord(truth.session_id, KIND_RECORD, event.seq, 1, b"not json", writer=event.writer),
             SessionRecord(truth.session_id, KIND_RECORD, event.seq, 1, event.value + b"\n" + event.value,
                           writer=event.writer)]  # the first claims 10^9 events
    position = records.index(event)
    config = ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive")
    outputs = run_batch(Archive(config), fetched(records[:position] + liars + records[position:]))
    assert _reasons(outputs) == [b"corrupt-storage"] * 3
    [path] = find_session_files(config.root)
    result = load_session(path)
    assert result.accepted and result.stored_count == truth.next_seq
    assert messages_digest(result.state.messages()) == truth.messages_digest


def test_a_session_id_too_long_for_a_file_name_gets_a_bounded_folder(tmp_path):
    from consumers.archiver.files import archive_segment
    long_id = "s" * 300
    segment = archive_segment(long_id)
    assert len(segment) <= 255 and segment.startswith("s" * 190) and segment != archive_segment(long_id + "t")
    assert "/" not in archive_segment("../x") and archive_segment("..") not in ("..", ".")


def test_pending_attestations_are_bounded_in_count_and_size():
    from consumers.auditor.session import ATTESTATION_BYTES, PENDING_LIMIT
    truth, records = _session(seed=50)
    header = next(r for r in records if r.kind == KIND_HEADER)
    waiting = [SessionRecord(truth.session_id, "attestation", 10_000 + n, 0, b'{"digest": "x"}')
               for n in range(PENDING_LIMIT + 1)]
    huge = SessionRecord(truth.session_id, "attestation", 5, 0, b'{"d": "' + b"x" * ATTESTATION_BYTES + b'"}')
    audit = Audit(AuditorConfig(kafka=KAFKA))
    outputs = run_batch(audit, fetched([header, huge] + waiting))
    assert _reasons(outputs) == [b"corrupt-storage", b"held-limit"]
    [session] = audit.sessions  # what waits counts against the service's held budget
    assert session.held_bytes() == PENDING_LIMIT * len(b'{"digest": "x"}')


def test_a_negative_token_count_is_the_log_s_to_keep_not_a_counter_s(tmp_path):
    truth, records = _session(seed=51)
    index, message = next((i, json.loads(r.value)) for i, r in enumerate(records)
                          if r.kind == KIND_RECORD and b'"assistant/message"' in r.value and b'"usage"' in r.value)
    message["data"]["usage"]["inputTokens"] = -5
    records[index] = SessionRecord(truth.session_id, KIND_RECORD, records[index].seq, 1, json.dumps(message).encode(),
                                   writer=records[index].writer)
    config = ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")
    outputs = run_batch(Projection(config), fetched(records))
    assert outputs.on(NAMES.dead_letter) == []
    store = ViewStore(config.store)
    try:
        view = store.view(truth.session_id)
    finally:
        store.close()
    assert view["status"] == "idle" and view["nextSeq"] == truth.next_seq


def test_a_second_different_header_is_a_conflicting_writer_and_a_copy_is_a_duplicate(tmp_path):
    truth, records = _session(seed=52)
    header = next(r for r in records if r.kind == KIND_HEADER)
    other = json.loads(header.value) | {"createdAt": json.loads(header.value)["createdAt"] + 1}
    second = SessionRecord(truth.session_id, KIND_HEADER, 0, 0, json.dumps(other).encode())
    policies = [Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                Audit(AuditorConfig(kafka=KAFKA)), Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]
    for policy in policies:
        outputs = run_batch(policy, fetched(records + [header, second]))
        [(_, _, headers)] = outputs.on(NAMES.dead_letter)
        assert headers["dsh-dlq-reason"] == b"conflicting-writer", policy.name
        assert b"a second header differing from the first (createdAt: " in headers["dsh-dlq-error"], policy.name


def test_other_bytes_at_an_applied_seq_are_a_conflicting_writer_not_a_duplicate(tmp_path):
    truth, records = _session(seed=53)
    records = [r for r in records if r.kind != KIND_ATTESTATION]
    original = next(r for r in records if r.kind == KIND_RECORD and r.seq == 3)
    forged = SessionRecord(truth.session_id, KIND_RECORD, 3, original.count, original.value.replace(b"{", b"{ ", 1),
                           writer=original.writer)
    policies = [Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                Audit(AuditorConfig(kafka=KAFKA, state=tmp_path / "auditor.sqlite", checkpoint_seconds=0)),
                Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]
    for policy in policies:
        # The digest in memory, then (a second batch: every record again) in the store.
        for batch in range(2):
            outputs = run_batch(policy, fetched(records + [forged]))
            [(_, _, headers)] = outputs.on(NAMES.dead_letter)
            assert headers["dsh-dlq-reason"] == b"conflicting-writer", policy.name
            assert re.search(rb"session '[^']+' seq 3: a record of sha256 [0-9a-f]{64}, where one of sha256 "
                             rb"[0-9a-f]{64} came first; two writers share this session id",
                             headers["dsh-dlq-error"]), policy.name
            if policy.name == "auditor":
                found = [(f["rule"], f["seq"]) for f in map(json.loads, (v for _, v, _ in outputs.on(NAMES.findings)))]
                assert found == [("conflicting-writer", 3)][batch:], found  # once per session
    [path] = find_session_files(tmp_path / "archive")
    assert load_session(path).stored_count == truth.next_seq


def test_a_record_claiming_another_format_than_its_session_is_refused_by_every_service(tmp_path):
    truth, records = _session(seed=47)
    header = next(r for r in records if r.kind == KIND_HEADER)
    claims_v4 = next(r for r in records if r.kind == KIND_RECORD and r.seq > 3)
    claims_v4 = SessionRecord(claims_v4.session_id, KIND_RECORD, claims_v4.seq, claims_v4.count, claims_v4.value, 4,
                              claims_v4.writer)
    header_v3 = SessionRecord(header.session_id, KIND_HEADER, 0, 0, header.value, 3, header.writer)
    policies = [Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")),
                Audit(AuditorConfig(kafka=KAFKA)), Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]
    for policy in policies:
        outputs = run_batch(policy, fetched([header_v3, header, claims_v4] + records))
        errors = [headers["dsh-dlq-error"] for _, _, headers in outputs.on(NAMES.dead_letter)]
        assert [error.split(b"': ", 1)[1] for error in errors] == [
            b"a header at seq 0 says dsh-format 3, but the session's header is format v0",
            f"a record at seq {claims_v4.seq} says dsh-format 4, but the session's header is format v0".encode()], \
            policy.name
