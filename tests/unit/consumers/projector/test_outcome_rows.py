"""The rows the outcome index writes take any record its topics may hold:
numbers beyond what a store column takes, bytes that are no UTF-8, values
that are no finding."""

from __future__ import annotations

from consumers.projector.outcomes import finding_row, letter_row
from tests.policy_driver import Fetched


def test_a_hostile_dead_letter_becomes_a_row_of_safe_values():
    record = Fetched(b"\xff\xfesession", b"x" * 1000, [("dsh-seq", b"9223372036854775808"),
                                                       ("dsh-dlq-offset", b"-99999999999999999999"),
                                                       ("dsh-dlq-partition", "٣".encode()),
                                                       ("dsh-dlq-reason", b"\xff")], 7, partition=1, timestamp=5)
    row = letter_row(record)
    assert row[:3] == (record.topic, 1, 7)
    assert (row[7], row[8], row[10]) == (None, None, None)  # partition, offset, seq: not safe integers
    assert row[4] == "\\xff" and row[12] == 1000 and len(row[13]) == 256
    assert row[9] is None  # a key that is no UTF-8 is no session's (not one spelled like its escaped bytes)


def test_a_dead_letter_with_numbers_of_thousands_of_digits_or_null_headers_becomes_a_row():
    digits = "9" * 5000  # past the digits Python's int() parses
    record = Fetched(b"s-1", b"x", [("dsh-seq", digits.encode()), ("dsh-dlq-offset", ("-" + digits).encode()),
                                    ("dsh-dlq-value-size", digits.encode()), ("dsh-dlq-reason", None),
                                    ("dsh-dlq-service", b"projector")], 8, timestamp=5)
    row = letter_row(record)
    assert (row[3], row[4], row[8], row[9], row[10], row[12]) == ("projector", "unknown", None, "s-1", None, 1)


def test_a_value_that_is_no_finding_is_kept_as_unreadable():
    for value in (b"\xff not json", b"[1, 2]", None):
        row = finding_row(Fetched(b"s-1", value, [], 3))
        assert (row[3], row[4], row[6]) == ("s-1", "unreadable", None) and row[9].startswith("not a finding object")
    row = finding_row(Fetched(b"s-1", b'{"rule": "x", "session": "s-2", "seq": 18446744073709551616}', [], 4))
    assert (row[3], row[4], row[6]) == ("s-2", "x", None)
