"""The redrive headers a record carries back from its dead letters: read
back as written, and headers that do not say (a null value among them, which
Kafka allows) name no source instead of failing."""

from __future__ import annotations

import pytest

from consumers.runtime.outputs import redrive_headers, redriven_from


def test_redrive_headers_read_back() -> None:
    headers = redrive_headers(("dsh.session-events", 2, 17), ["invalid-log", "held-limit"])
    assert redriven_from(headers) == (("dsh.session-events", 2, 17), frozenset({"invalid-log", "held-limit"}))


@pytest.mark.parametrize("null", ["dsh-redrive-topic", "dsh-redrive-partition", "dsh-redrive-offset",
                                  "dsh-redrive-reasons"])
def test_a_null_redrive_header_names_no_source(null: str) -> None:
    headers: list[tuple[str, bytes | None]] = [
        (name, None if name == null else value)
        for name, value in redrive_headers(("dsh.session-events", 2, 17), ["invalid-log"])]
    assert redriven_from(headers) is None


def test_a_record_never_redriven_names_no_source() -> None:
    assert redriven_from([("dsh-kind", b"record")]) is None
