"""The read API and viewer as an attacker meets them: every route but
health behind a token or a signed-in browser (the OpenAPI document too, no
docs page), strict security headers on every answer, session cookies that
are signed, expire and end at sign-out, CSRF tokens and same-origin checks
on the forms, throttled sign-ins, no open redirect after signing in, paged
sessions, and text shown as it is, never as its control characters would
have it. No broker, no store, no browser (tests/integration/
dsh_pipeline/web/test_viewer_chromium.py drives a real one)."""

from __future__ import annotations

import json
import re
import time

import pytest

from dsh_pipeline.web import browser_sessions, read_api
from dsh_pipeline.web.app import SECURITY_HEADERS
from dsh_pipeline.web.browser_sessions import CSRF_COOKIE, SESSION_COOKIE, BrowserSessions
from consumers.projector.session_pages import PREVIEW_CHARS
from tests.fake_reader import FakeReader
from tests.unit.dsh_pipeline.web.test_read_api import TOKEN, _session, client_of, reader, sign_in, signed_in  # noqa: F401 (fixtures)

PAGES = ("/", "/sessions/s-001", "/sessions/s-001?seq=1", "/findings", "/dead-letters", "/dead-letters/4",
         "/api/v1/sessions", "/api/v1/openapi.json", "/api/v1/summary", "/api/v1/events/1?session=s-001")


@pytest.mark.parametrize("path", ["/api/v1/openapi.json", "/api/v1/docs", "/api/v1/redoc", "/docs"])
def test_the_openapi_document_needs_a_token_and_there_is_no_docs_page(client_of, path):
    refused = client_of(None).get(path)
    assert refused.status_code in (401, 404), path
    assert "openapi" not in refused.text and "swagger" not in refused.text.lower()
    if path != "/api/v1/openapi.json":
        assert client_of().get(path).status_code == 404  # no page loading a script from a CDN


@pytest.mark.parametrize("path", [*PAGES, "/login", "/healthz", "/static/viewer.css", "/no-such-page"])
def test_every_answer_carries_the_security_headers(client_of, path):
    for client in (client_of(None), signed_in(client_of)):
        headers = client.get(path).headers
        for name, value in SECURITY_HEADERS:
            assert headers[name.decode()] == value.decode(), (path, name)
    policy = dict(SECURITY_HEADERS)[b"content-security-policy"].decode()
    assert "script-src" not in policy and "default-src 'none'" in policy and "frame-ancestors 'none'" in policy


def test_nothing_a_page_loads_comes_from_another_origin(client_of):
    browser = signed_in(client_of)
    for path in ("/login", "/", "/sessions/s-rich", "/sessions/s-rich?seq=5", "/findings", "/dead-letters",
                 "/dead-letters/4"):
        text = browser.get(path).text
        assert "<script" not in text and " style=" not in text and "http://" not in text and "https://" not in text


def test_the_session_cookie_is_signed_and_not_the_token(client_of):
    browser = signed_in(client_of)
    cookie = browser.cookies[SESSION_COOKIE]
    assert TOKEN not in cookie
    assert browser.get("/api/v1/summary").status_code == 200
    forged = client_of(None, cookie=cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB"))
    assert forged.get("/api/v1/summary").status_code == 401
    assert forged.get("/").headers["location"].startswith("/login")


def test_a_session_cookie_expires(client_of, monkeypatch):
    browser = signed_in(client_of)
    assert browser.get("/").status_code == 200
    later = time.time() + browser_sessions.SESSION_SECONDS + 5
    monkeypatch.setattr(time, "time", lambda: later)
    assert browser.get("/").headers["location"] == "/login?next=%2F"
    assert browser.get("/api/v1/summary").status_code == 401


def test_signing_out_ends_the_session_even_for_a_copy_of_its_cookie(client_of):
    browser = signed_in(client_of)
    cookie = browser.cookies[SESSION_COOKIE]
    page = browser.get("/")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert browser.request("POST", "/logout", data={"csrf": "not-the-token"}).status_code == 403
    assert browser.get("/").status_code == 200
    out = browser.request("POST", "/logout", data={"csrf": csrf})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert SESSION_COOKIE not in browser.cookies
    copy = client_of(None, cookie=cookie, app=browser.app)
    assert copy.get("/").headers["location"].startswith("/login")
    assert copy.get("/api/v1/summary").status_code == 401


def test_the_sign_in_form_needs_its_csrf_token(client_of):
    browser = client_of(None)
    assert browser.request("POST", "/login", data={"token": TOKEN}).status_code == 403
    form = browser.get("/login")
    assert CSRF_COOKIE in form.cookies
    other = client_of(None, app=browser.app)  # a token of another form: not this browser's cookie
    field = re.search(r'name="csrf" value="([^"]+)"', other.get("/login").text).group(1)
    refused = browser.request("POST", "/login", data={"token": TOKEN, "csrf": field})
    assert refused.status_code == 403 and "sign-in form" in refused.json()["error"]
    assert SESSION_COOKIE not in browser.cookies
    assert sign_in(browser).status_code == 303


@pytest.mark.parametrize("headers", [{"Origin": "https://evil.example"}, {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                                     {"Origin": "http://viewer.test", "Sec-Fetch-Site": "cross-site"}])
def test_a_form_another_site_posts_is_refused(client_of, headers):
    browser = client_of(None)
    field = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text).group(1)
    refused = browser.request("POST", "/login", data={"token": TOKEN, "csrf": field}, headers=headers)
    assert refused.status_code == 403 and "another site" in refused.json()["error"]
    same = browser.request("POST", "/login", data={"token": TOKEN, "csrf": field},
                           headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"})  # what Chromium sends
    assert same.status_code == 303


def test_failed_sign_ins_are_throttled_per_address(client_of, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    attacker = client_of(None, address="192.0.2.7")
    for _ in range(browser_sessions.MAX_FAILURES):
        assert sign_in(attacker, "guess").status_code == 401
    blocked = sign_in(attacker)  # even the right token, while the window lasts
    assert blocked.status_code == 429 and blocked.headers["retry-after"] == "60"
    assert "192.0.2.7" in blocked.json()["error"]
    bearer = client_of(address="192.0.2.7", app=attacker.app)
    assert bearer.get("/api/v1/summary").status_code == 429  # bearer tokens share the throttle
    assert sign_in(client_of(None, address="198.51.100.1", app=attacker.app)).status_code == 303
    now[0] += browser_sessions.FAILURE_WINDOW
    assert sign_in(attacker).status_code == 303


def test_failed_bearer_tokens_count_as_failed_sign_ins(client_of):
    guessing = client_of("guess", address="192.0.2.8")
    for _ in range(browser_sessions.MAX_FAILURES):
        assert guessing.get("/api/v1/summary").status_code == 401
    assert client_of(address="192.0.2.8", app=guessing.app).get("/api/v1/summary").status_code == 429


def test_the_throttle_remembers_a_bounded_number_of_addresses(monkeypatch):
    monkeypatch.setattr(browser_sessions, "MAX_ADDRESSES", 100)
    monkeypatch.setattr(browser_sessions, "MAX_SESSIONS", 10)
    browsers = BrowserSessions()
    for index in range(1000):
        browsers.failed(f"10.0.{index // 256}.{index % 256}")
        browsers.start()
    assert len(browsers._failures) == 100 and len(browsers._live) == 10


@pytest.mark.parametrize(("then", "lands"), [
    ("/sessions/s-001?after=3", "/sessions/s-001?after=3"), ("/?status=held", "/?status=held"),
    ("https://evil.example/", "/"), ("//evil.example/x", "/"), ("/\\evil.example", "/"),
    ("javascript:alert(1)", "/"), ("/\t/evil.example", "/"), (None, "/")])
def test_signing_in_returns_only_to_a_path_of_this_server(client_of, then, lands):
    signed = sign_in(client_of(None), then=then)
    assert signed.status_code == 303 and signed.headers["location"] == lands


def test_an_unsigned_page_sends_the_browser_to_sign_in_and_back(client_of):
    browser = client_of(None)
    sent = browser.get("/sessions/s-001", params={"after": 1})
    assert sent.headers["location"] == "/login?next=%2Fsessions%2Fs-001%3Fafter%3D1"
    form = browser.get(sent.headers["location"])
    assert 'name="next" value="/sessions/s-001?after=1"' in form.text
    assert sign_in(browser, then="/sessions/s-001?after=1").headers["location"] == "/sessions/s-001?after=1"


# ------------------------------------------------------------------------ paging


def _long_session(messages: int, text_bytes: int = 10) -> dict:
    session = _session(1)
    listed = [{"id": f"m-{index}", "role": "user", "source": {"kind": "user"},
               "content": [{"type": "text", "text": f"{index}:" + "x" * text_bytes}]} for index in range(messages)]
    session.update(sessionId="s-long", messages=listed, messageCount=messages,
                   messageSeqs={m["id"]: 2 * index + 1 for index, m in enumerate(listed)},
                   surface=[{"seq": 2 * index + 1, "type": "user/message", "data": m}
                            for index, m in enumerate(listed)])
    return session


def _api_pages(client, session_id: str, **params) -> list[dict]:
    pages, after = [], None
    while True:
        page = client.get(f"/api/v1/sessions/{session_id}",
                          params={**params, **({"after": after} if after is not None else {})})
        assert page.status_code == 200, page.text
        pages.append(page.json())
        if (after := pages[-1]["next"]) is None:
            return pages


def test_a_session_is_paged_by_seq_and_the_pages_hold_it_all(client_of):
    session = _long_session(50)
    client = client_of(app=read_api(FakeReader([session]), frozenset({TOKEN}), max_page=20))
    pages = _api_pages(client, "s-long")
    assert [len(page["messages"]) for page in pages] == [20, 20, 10]
    assert [m for page in pages for m in page["messages"]] == session["messages"]
    assert [e for page in pages for e in page["surface"]] == [{"time": None, "order": 0, **e} for e in session["surface"]]
    assert [page["next"] for page in pages] == ["39", "79", None]
    assert all(set(page["messageSeqs"]) == {m["id"] for m in page["messages"]} for page in pages)
    assert [len(page["messages"]) for page in _api_pages(client, "s-long", limit=7)][:2] == [7, 7]
    for wrong in ({"limit": 21}, {"after": "x"}, {"after": "1.2.3"}, {"after": "9" * 30}):
        answer = client.get("/api/v1/sessions/s-long", params=wrong)
        assert answer.status_code == 422 and f"'{next(iter(wrong))}'" in answer.json()["error"]


def test_a_compacted_session_is_paged_in_seq_order_each_event_on_one_page(client_of):
    session = _long_session(9)  # a compaction's summary (seq 17) before the messages it kept, in dsh's history
    session["messages"] = [session["messages"][8], *session["messages"][:8]]
    client = client_of(app=read_api(FakeReader([session]), frozenset({TOKEN}), max_page=4))
    pages = _api_pages(client, "s-long")
    assert [page["next"] for page in pages] == ["7", "15", None]
    assert [e for page in pages for e in page["surface"]] == [{"time": None, "order": 0, **e} for e in session["surface"]]
    assert sorted(m["id"] for page in pages for m in page["messages"]) == sorted(m["id"] for m in session["messages"])


def test_a_long_text_is_a_preview_with_its_size_and_its_event_comes_whole(client_of):
    session = _long_session(3, text_bytes=3 * PREVIEW_CHARS)
    client = client_of(app=read_api(FakeReader([session]), frozenset({TOKEN})))
    answer = client.get("/api/v1/sessions/s-long")
    page, whole = answer.json(), session["surface"][1]
    assert page["surface"][1]["preview"] == {"size": len(json.dumps(whole["data"], separators=(",", ":")))}
    assert page["messages"][1]["content"][0]["text"] == whole["data"]["content"][0]["text"][:PREVIEW_CHARS]
    assert len(answer.content) < 2 * 3 * (PREVIEW_CHARS + 1024)  # three cut messages and their events
    event = client.get("/api/v1/events/3", params={"session": "s-long"})
    assert event.status_code == 200 and event.json() == whole
    missing = client.get("/api/v1/events/4", params={"session": "s-long"})
    assert missing.status_code == 404 and "seq 4 of session 's-long'" in missing.json()["error"]
    assert client.get("/api/v1/events/3").status_code == 422  # which session's


def test_the_viewer_shows_a_long_text_cut_and_links_its_whole_message(client_of):
    session = _long_session(2, text_bytes=3 * PREVIEW_CHARS)
    browser = signed_in(client_of, app=read_api(FakeReader([session]), frozenset({TOKEN})))
    page = browser.get("/sessions/s-long")
    assert "1:" + "x" * (PREVIEW_CHARS - 2) + "</div>" in page.text
    links = re.findall(r'<a href="([^"]+)" class="whole">', page.text)
    assert links == ["/sessions/s-long?seq=1", "/sessions/s-long?seq=3"]
    whole = browser.get(links[1])
    assert whole.status_code == 200 and "1:" + "x" * 3 * PREVIEW_CHARS in whole.text
    assert 'class="whole"' not in whole.text
    assert browser.get("/sessions/s-long?seq=2").status_code == 404


def test_the_viewer_pages_a_long_conversation(client_of):
    session = _long_session(130)
    browser = signed_in(client_of, app=read_api(FakeReader([session]), frozenset({TOKEN})))
    pages, following = [], "/sessions/s-long"
    while following is not None:
        page = browser.get(following).text
        pages.append(re.findall(r'data-id="(m-\d+)"', page))
        found = re.search(r'<a href="([^"]+)" rel="next" id="next">', page)
        following = found.group(1) if found else None
        assert following in ("/sessions/s-long?after=99", "/sessions/s-long?after=199", None)
    assert [len(shown) for shown in pages] == [50, 50, 30]
    assert [m for shown in pages for m in shown] == [m["id"] for m in session["messages"]]


# ------------------------------------------------------------ what a page shows


HIDDEN = "\u202e\u2066\x1b[2J\x07\x00\u200b\ufeff"


def test_control_and_bidi_characters_are_shown_as_escapes(client_of):
    session = _long_session(1)
    tricky = f"s-{HIDDEN}-1"
    session.update(sessionId=tricky, cwd=f"/home/{HIDDEN}")
    session["messages"][0]["content"][0]["text"] = f"run {HIDDEN} this\nline two"
    browser = signed_in(client_of, app=read_api(FakeReader([session]), frozenset({TOKEN})))
    listing = browser.get("/")
    link = re.search(r'<a href="(/sessions/[^"]+)">', listing.text).group(1)
    for page in (listing, browser.get(link)):
        assert page.status_code == 200
        assert not any(character in page.text for character in HIDDEN if not character.isprintable()), page.url
        assert "\\u202e\\u2066\\u001b[2J\\u0007\\u0000\\u200b\\ufeff" in page.text
    assert "this\nline two" in page.text  # newlines are text, not hidden


def test_a_session_id_with_slashes_opens_in_the_viewer_and_the_api(client_of):
    session = _long_session(3)
    session.update(sessionId="team/a/../b?x#y")
    browser = signed_in(client_of, app=read_api(FakeReader([session]), frozenset({TOKEN})))
    link = re.search(r'<a href="(/sessions/[^"]+)">', browser.get("/").text).group(1)
    assert link == "/sessions/team%2Fa%2F..%2Fb%3Fx%23y"
    page = browser.get(link)
    assert page.status_code == 200 and len(re.findall(r'data-id="m-\d+"', page.text)) == 3
    assert browser.get(link.replace("/sessions/", "/api/v1/sessions/")).json()["sessionId"] == "team/a/../b?x#y"


def test_a_lone_surrogate_is_kept_exactly_by_the_api_and_shown_escaped_by_the_viewer(client_of):
    session = _long_session(1)
    session["messages"][0]["content"][0]["text"] = "half a pair: \udc80"
    browser = signed_in(client_of, app=read_api(FakeReader([session]), frozenset({TOKEN})))
    answer = browser.get("/api/v1/sessions/s-long")
    assert answer.status_code == 200 and b"\\udc80" in answer.content
    assert json.loads(answer.content)["messages"] == session["messages"]
    page = browser.get("/sessions/s-long")
    assert page.status_code == 200 and "half a pair: \\udc80" in page.text
