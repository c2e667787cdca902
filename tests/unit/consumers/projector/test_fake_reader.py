"""The in-memory reader the read API's tests compare against answers as the
SQLite store's reader does over the same projected fleet: listings under
every filter, page by page, each session, findings and the summary."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from consumers.projector.reader import FindingFilter, SessionFilter
from consumers.projector.store_reader import StoreReader
from tests.fake_reader import SUMMARY_FIELDS, FakeReader
from tests.view_store_helpers import stored_fleet


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    location = tmp_path_factory.mktemp("fake-reader") / "views.sqlite"
    ids = [truth.session_id for truth, _ in stored_fleet(location)]
    store = StoreReader(location)
    fake = FakeReader([store.session(session_id) for session_id in ids],
                      store.findings(FindingFilter(), limit=10_000)["items"])
    yield store, fake, ids
    store.close()


def _every_page(listing: Callable[..., dict[str, Any]], where: Any, limit: int = 2) -> list[dict[str, Any]]:
    items, cursor = [], None
    while True:
        page = listing(where, cursor, limit)
        items += page["items"]
        if (cursor := page["next"]) is None:
            return items


def _listed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A listing's summaries without ``models`` (the store lists every token
    column of its usage table, a session view only those it counted)."""
    return [{field: item[field] for field in SUMMARY_FIELDS if field != "models"} for item in items]


FILTERS = [SessionFilter(), SessionFilter(status=("held",)), SessionFilter(status=("idle", "open")),
           SessionFilter(cwd="/home/dev/project-1"), SessionFilter(provider="deepseek"),
           SessionFilter(model="deepseek-chat"), SessionFilter(has_findings=True), SessionFilter(has_findings=False),
           SessionFilter(created_from=1_767_600_000_000, created_to=1_768_000_000_000),
           SessionFilter(active_from=1_767_700_000_000, active_to=1_768_000_000_000), SessionFilter(text="Sandbox OFF"),
           SessionFilter(text="role"), SessionFilter(text='"'), SessionFilter(text="fix"),  # text, not JSON
           SessionFilter(status=("idle",), model="deepseek-reasoner", active_to=1_768_000_000_000)]


@pytest.mark.parametrize("where", FILTERS, ids=[repr(where) for where in FILTERS])
def test_listings_match_the_store_readers_page_by_page(readers, where):
    store, fake, _ = readers
    expected = _every_page(store.sessions, where)
    assert _listed(_every_page(fake.sessions, where)) == _listed(expected)
    assert len(_every_page(fake.sessions, where, limit=50)) == len(expected)


def test_sessions_findings_and_summary_match_the_store_readers(readers):
    store, fake, ids = readers
    for session_id in ids:
        assert fake.session(session_id) == store.session(session_id)
    assert fake.session("no-such-session") is None and store.session("no-such-session") is None
    assert _every_page(fake.findings, FindingFilter()) == _every_page(store.findings, FindingFilter())
    assert fake.summary() == store.summary()
    assert fake.resolve(ids[1][:12]) == store.resolve(ids[1][:12])


def _paged(page: dict[str, Any]) -> dict[str, Any]:
    """A page but its ``models`` (as :func:`_listed`)."""
    return {field: value for field, value in page.items() if field != "models"}


def test_session_pages_match_the_store_readers(readers):
    store, fake, ids = readers
    for session_id in ids:
        after: int | None = None
        while True:
            page = store.session_page(session_id, after, 3)
            assert _paged(fake.session_page(session_id, after, 3)) == _paged(page)
            if page["next"] is None:
                break
            after = int(page["next"])
        whole = store.surface_event(session_id, page["surface"][-1]["seq"]) if page["surface"] else None
        assert whole is None or fake.surface_event(session_id, whole["seq"]) == whole
    assert fake.session_page("no-such-session") is None and store.session_page("no-such-session") is None


def test_text_search_finds_message_text_not_the_json_around_it(readers):
    store, _, ids = readers
    assert store.sessions(SessionFilter(text="role"))["items"] == []  # every surface row's JSON holds "role"
    assert store.sessions(SessionFilter(text="Sandbox OFF"))["items"]  # a runtime-context message's text


def test_a_cursor_neither_gave_is_a_value_error_naming_it(readers):
    store, fake, _ = readers
    for reader in (store, fake):
        with pytest.raises(ValueError, match="cursor 'forged' is not one this"):
            reader.sessions(SessionFilter(), "forged")
