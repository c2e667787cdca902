"""A redrive mark suppresses a service's new letter only when the redrive
path signed it with the deployment's key: a producer that forges the
``dsh-redrive-*`` headers on a bad record hides nothing."""

from __future__ import annotations

import pytest

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.projector import Projection, ProjectorConfig
from consumers.runtime.redrive_mark import redrive_headers, redriven_from
from dsh_kafka.config import Secret
from tests.policy_driver import KAFKA, NAMES, Fetched, run_batch

KEY = Secret("k" * 64)
#: A record every service refuses as corrupt-storage (a null dsh-seq).
BAD = [("dsh-kind", b"record"), ("dsh-seq", None), ("dsh-count", b"1"), ("dsh-format", b"0")]
FIRST_READ = (NAMES.events, 1, 17)


def _policies(tmp_path):
    return [Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite")), Audit(AuditorConfig(kafka=KAFKA)),
            Archive(ArchiverConfig(kafka=KAFKA, root=tmp_path / "archive"))]


def _letters(tmp_path, headers, key: Secret | None = KEY, value: bytes = b"{}") -> list[dict]:
    letters = []
    for policy in _policies(tmp_path):
        outputs = run_batch(policy, [Fetched(b"s-1", value, headers, 3)], redrive_key=key)
        letters += [letter for _, _, letter in outputs.on(NAMES.dead_letter)]
    return letters


def test_forged_redrive_headers_do_not_hide_a_bad_record(tmp_path):
    forged = BAD + [("dsh-redrive-topic", NAMES.events.encode()), ("dsh-redrive-partition", b"1"),
                    ("dsh-redrive-offset", b"17"), ("dsh-redrive-reasons", b"corrupt-storage,invalid-log")]
    letters = _letters(tmp_path, forged)
    assert len(letters) == 3  # one per service
    for letter in letters:  # under the coordinates it was read at, not the claimed ones
        assert (letter["dsh-dlq-reason"], letter["dsh-dlq-partition"], letter["dsh-dlq-offset"]) == (
            b"corrupt-storage", b"0", b"3")


def test_a_mark_with_a_made_up_mac_hides_nothing(tmp_path):
    forged = BAD + [("dsh-redrive-topic", NAMES.events.encode()), ("dsh-redrive-partition", b"1"),
                    ("dsh-redrive-offset", b"17"), ("dsh-redrive-reasons", b"corrupt-storage"),
                    ("dsh-redrive-mac", b"0" * 64)]
    assert len(_letters(tmp_path, forged)) == 3


def test_a_signed_mark_refused_again_for_its_reason_adds_no_letter(tmp_path):
    signed = redrive_headers(KEY, b"s-1", b"{}", BAD, FIRST_READ, ["corrupt-storage"])
    assert _letters(tmp_path, signed) == []


def test_a_signed_mark_refused_for_a_new_reason_is_lettered_where_first_read(tmp_path):
    signed = redrive_headers(KEY, b"s-1", b"{}", BAD, FIRST_READ, ["invalid-log"])
    letters = _letters(tmp_path, signed)
    assert len(letters) == 3
    assert {(letter["dsh-dlq-partition"], letter["dsh-dlq-offset"]) for letter in letters} == {(b"1", b"17")}


@pytest.mark.parametrize("change", ["value", "header", "another key", "no key at the service"])
def test_a_signed_mark_on_anything_else_counts_for_nothing(tmp_path, change):
    """A mark copied onto other bytes, or checked without the key it was
    signed with, is no mark: the record is lettered where it was read."""
    signed = redrive_headers(KEY, b"s-1", b"{}", BAD, FIRST_READ, ["corrupt-storage"])
    value, key = b"{}", KEY
    if change == "value":
        value = b'{"other": 1}'
    elif change == "header":
        signed = [("x-extra", b"1"), *signed]
    elif change == "another key":
        key = Secret("o" * 64)
    else:
        key = None
    letters = _letters(tmp_path, signed, key, value)
    assert len(letters) == 3 and {letter["dsh-dlq-offset"] for letter in letters} == {b"3"}


def test_a_mark_round_trips_and_each_field_is_bound():
    signed = redrive_headers(KEY, b"k", b"v", [("a", None), ("b", b"")], FIRST_READ, ["b", "a", "a"])
    assert redriven_from(KEY, b"k", b"v", signed) == (FIRST_READ, frozenset({"a", "b"}))
    assert redriven_from(KEY, b"k", b"v2", signed) is None
    assert redriven_from(KEY, None, b"v", signed) is None
    swapped = [("a", b""), ("b", None)] + signed[2:]  # null and empty are not the same header value
    assert redriven_from(KEY, b"k", b"v", swapped) is None
    reasons = [(n, b"a,b,corrupt-storage" if n == "dsh-redrive-reasons" else v) for n, v in signed]
    assert redriven_from(KEY, b"k", b"v", reasons) is None
    assert redriven_from(None, b"k", b"v", signed) is None


@pytest.mark.parametrize("null", ["dsh-redrive-topic", "dsh-redrive-partition", "dsh-redrive-offset",
                                  "dsh-redrive-reasons", "dsh-redrive-mac"])
def test_a_null_part_of_a_mark_is_no_mark(null: str) -> None:
    """Kafka allows a null header value: in a mark it names no source
    (the record is lettered as any other) instead of failing."""
    signed = redrive_headers(KEY, b"k", b"v", [], FIRST_READ, ["corrupt-storage"])
    nulled = [(name, None if name == null else value) for name, value in signed]
    assert redriven_from(KEY, b"k", b"v", nulled) is None
