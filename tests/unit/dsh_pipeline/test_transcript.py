"""The times readers show: a calendar date, or what the log holds where it
names none."""

from __future__ import annotations

import pytest

from dsh_pipeline.transcript import format_time
from tests.fake_reader import FakeReader
from tests.unit.dsh_pipeline.web.test_read_api import _session, client_of, signed_in  # noqa: F401 (fixtures)


@pytest.mark.parametrize(("ms", "shown"), [
    (1_767_225_599_000, "2025-12-31 23:59:59 UTC"), (None, "-"), (0, "0 (no time set)"),
    (1, "1970-01-01 00:00:00 UTC"), (10**20, "100000000000000000000"), (0.0, "1970-01-01 00:00:00 UTC"),
])
def test_a_time_is_a_date_where_it_names_one(ms, shown):
    assert format_time(ms) == shown


@pytest.fixture
def reader() -> FakeReader:
    return FakeReader([_session(1) | {"createdAt": 0, "lastActivity": 0}])


def test_the_viewer_shows_a_session_created_at_time_0_as_no_time_set_not_1970(client_of):
    browser = signed_in(client_of)
    page = browser.get("/sessions/s-001").text
    assert "created 0 (no time set) · last active 0 (no time set)" in page
    assert "1970" not in page and "1970" not in browser.get("/").text
