"""The read API and the viewer's pages over an in-memory reader
(:class:`tests.fake_reader.FakeReader`): every endpoint and filter answers
what the reader holds, pages reach the end, tokens are required, a
malformed parameter is a 422 naming it, CORS is off unless configured, and
the pages escape what sessions hold. No broker, no store, no browser."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from consumers.projector.reader import STATUSES, DeadLetterFilter, FindingFilter, SessionFilter
from dsh_pipeline.prices import load_prices
from dsh_pipeline.web import read_api
from dsh_pipeline.web.app import MAX_QUERY_BYTES
from dsh_pipeline.web.browser_sessions import SESSION_COOKIE
from tests.fake_reader import FakeReader

TOKEN = "unit-test-token"
MAX_PAGE = 7
BASE = 1_767_000_000_000  # ms
HOUR = 3_600_000
SESSIONS = 60  # more than the viewer's page of 50
INJECTED = "<script>alert('x')</script>"


def _session(index: int) -> dict[str, Any]:
    """Session ``s-NNN``: status, folder, models and times vary with the index;
    every seventh user asks about a needle; session 0 has no header yet."""
    text = f"question {index}" + (" about the Needle" if index % 7 == 0 else "")
    messages = [{"id": f"u-{index}", "role": "user", "content": [{"type": "text", "text": text}],
                 "source": {"kind": "user"}},
                {"id": f"a-{index}", "role": "assistant", "content": [{"type": "text", "text": f"answer {index}"}],
                 "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}}]
    models = [{"provider": "deepseek" if index % 2 else "openai", "model": f"m-{index % 3}",
               "inputTokens": 100 * index, "outputTokens": 10 * index}]
    return {"sessionId": f"s-{index:03d}", "status": STATUSES[index % len(STATUSES)],
            "cwd": None if index == 0 else f"/home/dev/project-{index % 3}",
            "createdAt": None if index == 0 else BASE + index * 60_000,
            "lastActivity": None if index == 0 else BASE + (index // 2) * HOUR,  # pairs tie: the id decides
            "turnCount": 1, "messageCount": len(messages), "models": models, "error": None,
            "header": {} if index == 0 else {"cwd": f"/home/dev/project-{index % 3}"}, "nextSeq": 4,
            "turns": [{"turn": 1, "reason": {"kind": "completed"}, "steps": 1}], "requestHeader": None,
            "requestHeaderChanges": [], "audit": None, "replaceGeneration": 0, "messages": messages, "messageSeqs": {f"u-{index}": 1, f"a-{index}": 3},
            "surface": [{"seq": 1, "type": "user/message", "data": messages[0]},
                        {"seq": 3, "type": "assistant/message", "data": {"turn": 1, "step": 1, "message": messages[1]}}]}


def _rich_session() -> dict[str, Any]:
    """A conversation with reasoning, a tool call and its result, a compaction
    summary, and text that must be escaped."""
    messages = [
        {"id": "u-1", "role": "user", "content": [{"type": "text", "text": f"run the tests {INJECTED}"}],
         "source": {"kind": "user"}},
        {"id": "a-1", "role": "assistant", "source": {"kind": "model", "provider": "deepseek", "model": "m-0"},
         "content": [{"type": "reasoning", "text": "the tests live in tests/"},
                     {"type": "tool-call", "id": "call-1", "name": "shell", "arguments": '{"command": "pytest"}'}]},
        {"id": "t-1", "role": "user", "source": {"kind": "tool", "callId": "call-1"},
         "content": [{"type": "tool-result", "callId": "call-1", "isError": True,
                      "content": [{"type": "text", "text": "2 failed"}]}]},
        {"id": "c-1", "role": "user", "source": {"kind": "compact-checkpoint"},
         "content": [{"type": "text", "text": "summary of the work so far"}]},
    ]
    session = _session(1)
    session.update(sessionId="s-rich", messages=messages, messageCount=len(messages),
                   messageSeqs={"u-1": 2, "a-1": 5, "t-1": 8, "c-1": 12},
                   surface=[{"seq": 2, "type": "user/message", "data": messages[0]},
                            {"seq": 5, "type": "assistant/message", "data": {"turn": 1, "step": 1, "message": messages[1]}},
                            {"seq": 8, "type": "tool/result", "data": {"turn": 1, "message": messages[2]}},
                            {"seq": 12, "type": "user/message", "data": messages[3]}],
                   requestHeaderChanges=[{"seq": 1, "reason": "initial", "system": f"be brief {INJECTED}",
                                          "toolsAdded": ["shell"], "config": {"model": "m-0"}},
                                         {"seq": 9, "reason": "change", "toolsRemoved": ["shell"],
                                          "config": {"reasoningEffort": "off"}}],
                   audit={"attested": {"mismatch": 1, "verified": 2}, "wire": {"agent": {"unlogged": 1}}},
                   turns=[{"turn": 1, "reason": {"kind": "completed"}, "steps": 2},
                          {"turn": 2, "reason": {"kind": "error", "error": {"message": "upstream 500"}}, "steps": 1}])
    return session


def _findings() -> list[dict[str, Any]]:
    found = [{"id": f"0-{index}", "sessionId": f"s-{index:03d}", "rule": ("request-mismatch", "usage-drift")[index % 2],
              "severity": ("error", "warning")[index % 4 // 2], "seq": 3, "turn": 1, "step": 1,
              "detail": f"finding {index}", "at": BASE + index * 1000}
             for index in range(3, SESSIONS, 3)]
    return found + [{"id": "1-0", "sessionId": "s-rich", "rule": "request-mismatch", "severity": "error", "seq": 6,
                     "turn": 1, "step": 2, "detail": f"the request differs {INJECTED}", "at": BASE}]


def _dead_letters() -> list[dict[str, Any]]:
    return [{"id": index, "service": ("projector", "auditor", "archiver")[index % 3],
             "reason": ("invalid-log", "corrupt-storage")[index % 2], "detail": f"letter {index}",
             "topic": "dsh.events", "partition": 0, "offset": index, "sessionId": f"s-{index:03d}", "seq": 2,
             "at": BASE + (index // 2) * 1000, "size": 10, "head": "{\"type\""} for index in range(17)]


class _Client:
    """Sync requests to an ASGI app in memory (httpx over one event loop)."""

    def __init__(self, app: Any, address: str = "127.0.0.1", **options: Any) -> None:
        self.app, self._runner = app, asyncio.Runner()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 40000)),
                                         base_url="http://viewer.test", **options)

    def request(self, method: str, path: str, **options: Any) -> httpx.Response:
        return self._runner.run(self._client.request(method, path, **options))

    def get(self, path: str, **options: Any) -> httpx.Response:
        return self.request("GET", path, **options)

    @property
    def cookies(self) -> httpx.Cookies:
        return self._client.cookies

    def close(self) -> None:
        self._runner.run(self._client.aclose())
        self._runner.close()


@pytest.fixture
def reader() -> FakeReader:
    return FakeReader([_session(index) for index in range(SESSIONS)] + [_rich_session()], _findings(),
                      _dead_letters())


@pytest.fixture
def client_of(reader):
    made = []

    def client(token: str | None = TOKEN, *, cookie: str | None = None, app: Any = None,
               address: str = "127.0.0.1", **factory: Any) -> _Client:
        """A client from ``address`` sending ``token`` as a bearer token and
        ``cookie`` as the viewer's session cookie, to ``app`` or one made
        with ``factory``'s options."""
        app = app or read_api(reader, frozenset({TOKEN, "second-token"}), max_page=MAX_PAGE, **factory)
        made.append(_Client(app, address, headers={"Authorization": f"Bearer {token}"} if token else {},
                            cookies={SESSION_COOKIE: cookie} if cookie else {}))
        return made[-1]

    yield client
    for client in made:
        client.close()


PRICES = load_prices()


def _priced(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Usage rows as the API answers them: each with its cost by the packaged prices."""
    return [row | {"costUsd": PRICES.cost(row["provider"], row["model"], row)} for row in rows]


def _priced_session(item: dict[str, Any]) -> dict[str, Any]:
    """A session (or a page of one) as the API answers it: its usage rows,
    steps and turns priced, and its own cost, null while one model it used
    has no price."""
    models = _priced(item["models"])
    costs = [model["costUsd"] for model in models]
    steps = _priced(item.get("steps", []))
    priced = item | {"models": models, "costUsd": None if None in costs else round(sum(costs), 6)}
    if "steps" in item:
        turns = []
        for turn in item["turns"]:
            own = [step["costUsd"] for step in steps if step["turn"] == turn["turn"] and step["model"]]
            turns.append(turn | {"costUsd": None if None in own else round(sum(own), 6)})
        priced |= {"steps": steps, "turns": turns}
    return priced


def _all_pages(client: _Client, path: str, params: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Every item of a listing, page by page, and how many pages it took."""
    items, cursor, pages = [], None, 0
    while True:
        answer = client.get(path, params={**params, "limit": MAX_PAGE, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        page, pages = answer.json(), pages + 1
        assert len(page["items"]) <= MAX_PAGE
        items += page["items"]
        if (cursor := page["next"]) is None:
            return items, pages


ROUTES = ("/api/v1/sessions", "/api/v1/sessions/s-001", "/api/v1/findings", "/api/v1/dead-letters",
          "/api/v1/dead-letters/4", "/api/v1/summary", "/api/v1/events/1?session=s-001")


@pytest.mark.parametrize("route", ROUTES)
def test_every_api_route_needs_a_token_of_the_service(client_of, route):
    for client in (client_of(None), client_of("not-a-token"), client_of(TOKEN + "x")):
        refused = client.get(route)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in refused.json()["error"]
    assert client_of(None).get(route, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert client_of(TOKEN).get(route).status_code == 200
    assert client_of("second-token").get(route).status_code == 200
    assert client_of(None, cookie="not-a-token").get(route).status_code == 401
    assert client_of(None, cookie=TOKEN).get(route).status_code == 401  # a token is not a session
    assert signed_in(client_of).get(route).status_code == 200


def test_health_needs_no_token(client_of):
    assert client_of(None).get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize("tokens", [frozenset(), frozenset({""}), frozenset({TOKEN, ""})])
def test_the_api_is_not_made_without_real_tokens(reader, tokens):
    with pytest.raises(ValueError, match="at least one non-empty token"):
        read_api(reader, tokens)


SESSION_FILTERS = [
    ({"status": "held"}, SessionFilter(status=("held",))),
    ({"status": ["open", "refused"]}, SessionFilter(status=("open", "refused"))),
    ({"provider": "deepseek"}, SessionFilter(provider="deepseek")),
    ({"model": "m-2"}, SessionFilter(model="m-2")),
    ({"cwd": "/home/dev/project-1"}, SessionFilter(cwd="/home/dev/project-1")),
    ({"created_from": BASE + 10 * 60_000, "created_to": BASE + 20 * 60_000},
     SessionFilter(created_from=BASE + 10 * 60_000, created_to=BASE + 20 * 60_000)),
    ({"active_from": BASE + 5 * HOUR}, SessionFilter(active_from=BASE + 5 * HOUR)),
    ({"active_to": BASE + 5 * HOUR}, SessionFilter(active_to=BASE + 5 * HOUR)),
    ({"has_findings": "true"}, SessionFilter(has_findings=True)),
    ({"has_findings": "false"}, SessionFilter(has_findings=False)),
    ({"q": "NEEDLE"}, SessionFilter(text="NEEDLE")),
    ({"status": "idle", "provider": "deepseek", "q": "needle"},
     SessionFilter(status=("idle",), provider="deepseek", text="needle")),
]


@pytest.mark.parametrize(("params", "where"), SESSION_FILTERS, ids=[str(p) for p, _ in SESSION_FILTERS])
def test_the_session_listing_pages_to_the_end_of_what_the_reader_holds(client_of, reader, params, where):
    expected = reader.sessions(where, limit=10_000)["items"]
    assert 0 < len(expected) < SESSIONS, "a filter that selects nothing or everything tests nothing"
    listed, pages = _all_pages(client_of(), "/api/v1/sessions", params)
    assert listed == [_priced_session(item) for item in expected]
    assert pages == max(1, -(-len(expected) // MAX_PAGE))


def test_the_unfiltered_listing_is_the_whole_fleet_most_recently_active_first(client_of, reader):
    listed, _ = _all_pages(client_of(), "/api/v1/sessions", {})
    assert len(listed) == SESSIONS + 1 and len({item["sessionId"] for item in listed}) == SESSIONS + 1
    keys = [(item["lastActivity"] or 0, item["sessionId"]) for item in listed]
    assert keys == sorted(keys, reverse=True)
    assert listed[-1]["sessionId"] == "s-000"  # never active: last


def test_a_session_is_the_readers_and_a_missing_one_is_a_404_naming_it(client_of, reader):
    client = client_of()
    page = reader.session_page("s-rich", None, MAX_PAGE)
    assert client.get("/api/v1/sessions/s-rich").json() == _priced_session(page)
    missing = client.get("/api/v1/sessions/no such <session>")
    assert missing.status_code == 404 and missing.json() == {"error": "no session 'no such <session>' in the view store"}


FINDING_FILTERS = [
    ({"rule": "usage-drift"}, FindingFilter(rule="usage-drift")),
    ({"severity": "warning"}, FindingFilter(severity="warning")),
    ({"session": "s-rich"}, FindingFilter(session_id="s-rich")),
    ({"since": BASE + 20_000, "until": BASE + 40_000}, FindingFilter(since=BASE + 20_000, until=BASE + 40_000)),
    ({"rule": "request-mismatch", "severity": "error"}, FindingFilter(rule="request-mismatch", severity="error")),
]


@pytest.mark.parametrize(("params", "where"), FINDING_FILTERS, ids=[str(p) for p, _ in FINDING_FILTERS])
def test_findings_page_to_the_end_of_what_the_reader_holds(client_of, reader, params, where):
    expected = reader.findings(where, limit=10_000)["items"]
    assert 0 < len(expected) < len(_findings())
    assert _all_pages(client_of(), "/api/v1/findings", params)[0] == expected


LETTER_FILTERS = [
    ({"service": "archiver"}, DeadLetterFilter(service="archiver")),
    ({"reason": "corrupt-storage"}, DeadLetterFilter(reason="corrupt-storage")),
    ({"session": "s-004"}, DeadLetterFilter(session_id="s-004")),
    ({"service": "projector", "reason": "invalid-log"}, DeadLetterFilter(service="projector", reason="invalid-log")),
]


@pytest.mark.parametrize(("params", "where"), LETTER_FILTERS, ids=[str(p) for p, _ in LETTER_FILTERS])
def test_dead_letters_page_to_the_end_of_what_the_reader_holds(client_of, reader, params, where):
    expected = reader.dead_letters(where, limit=10_000)["items"]
    assert 0 < len(expected) < len(_dead_letters())
    assert _all_pages(client_of(), "/api/v1/dead-letters", params)[0] == expected


def test_all_findings_and_dead_letters_page_newest_first(client_of):
    findings, _ = _all_pages(client_of(), "/api/v1/findings", {})
    letters, pages = _all_pages(client_of(), "/api/v1/dead-letters", {})
    assert sorted(f["id"] for f in findings) == sorted(f["id"] for f in _findings())
    assert [letter["id"] for letter in letters] == sorted(range(17), key=lambda i: (i // 2, i), reverse=True)
    assert pages == 3


def test_a_dead_letter_by_id_and_a_missing_one_is_a_404_naming_it(client_of, reader):
    client = client_of()
    assert client.get("/api/v1/dead-letters/5").json() == reader.dead_letter(5)
    missing = client.get("/api/v1/dead-letters/999")
    assert missing.status_code == 404 and missing.json() == {"error": "no dead letter 999 in the view store"}


def test_the_summary_is_the_readers(client_of, reader):
    summary = client_of().get("/api/v1/summary").json()
    expected = reader.summary()
    assert summary == {**expected, "tokensByModelPerHour": _priced(expected["tokensByModelPerHour"]),
                       "prices": {"taken": PRICES.taken.isoformat(), "source": PRICES.source}}
    assert sum(summary["sessionsByStatus"].values()) == SESSIONS + 1


@pytest.mark.parametrize(("path", "parameter", "where"), [
    ("/api/v1/sessions?status=bogus", "status", "query"),
    ("/api/v1/sessions?status=idle&status=bogus", "status", "query"),
    ("/api/v1/sessions?created_from=yesterday", "created_from", "query"),
    ("/api/v1/sessions?active_to=1.5", "active_to", "query"),
    ("/api/v1/sessions?has_findings=maybe", "has_findings", "query"),
    ("/api/v1/sessions?limit=0", "limit", "query"),
    (f"/api/v1/sessions?limit={MAX_PAGE + 1}", "limit", "query"),
    ("/api/v1/sessions?q=" + "x" * 513, "q", "query"),
    ("/api/v1/sessions?cursor=forged", "cursor", "query"),
    ("/api/v1/findings?severity=fatal", "severity", "query"),
    ("/api/v1/findings?since=noon", "since", "query"),
    ("/api/v1/dead-letters?service=mailer", "service", "query"),
    ("/api/v1/dead-letters/first", "letter_id", "path"),
])
def test_a_malformed_parameter_is_a_422_naming_it(client_of, path, parameter, where):
    answer = client_of().get(path)
    assert answer.status_code == 422
    assert answer.json()["error"].startswith(f"{where} parameter {parameter!r}: ")


def test_a_cursor_of_another_listing_is_a_422_naming_the_cursor(client_of):
    client = client_of()
    cursor = client.get("/api/v1/dead-letters", params={"limit": 2}).json()["next"]
    answer = client.get("/api/v1/sessions", params={"cursor": cursor})
    assert answer.status_code == 422 and answer.json()["error"].startswith("query parameter 'cursor': ")


def test_an_over_long_query_string_is_refused_before_the_reader_is_asked(client_of):
    answer = client_of().get("/api/v1/sessions", params={"cwd": "/" * MAX_QUERY_BYTES})
    assert answer.status_code == 414 and str(MAX_QUERY_BYTES) in answer.json()["error"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_the_api_is_read_only(client_of, method):
    answer = client_of().request(method, "/api/v1/sessions/s-001")
    assert answer.status_code == 405 and answer.json() == {"error": "this API is read-only"}


def test_cors_is_off_unless_origins_are_given(client_of):
    origin = {"Origin": "https://elsewhere.example"}
    assert "access-control-allow-origin" not in client_of().get("/api/v1/sessions", headers=origin).headers
    allowing = client_of(cors_origins=("https://viewer.example",))
    allowed = allowing.get("/api/v1/sessions", headers={"Origin": "https://viewer.example"})
    assert allowed.headers["access-control-allow-origin"] == "https://viewer.example"
    assert "access-control-allow-origin" not in allowing.get("/api/v1/sessions", headers=origin).headers
    preflight = allowing.request("OPTIONS", "/api/v1/sessions", headers={
        "Origin": "https://viewer.example", "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200 and "GET" in preflight.headers["access-control-allow-methods"]


def test_the_openapi_document_describes_every_route_and_its_parameters(client_of):
    document = client_of().get("/api/v1/openapi.json").json()
    assert set(document["paths"]) == {"/api/v1/sessions", "/api/v1/sessions/{session_id}", "/api/v1/findings",
                                      "/api/v1/dead-letters", "/api/v1/dead-letters/{letter_id}", "/api/v1/summary",
                                      "/api/v1/events/{seq}"}
    listing = {p["name"]: p for p in document["paths"]["/api/v1/sessions"]["get"]["parameters"]}
    assert set(listing) == {"status", "provider", "model", "cwd", "created_from", "created_to", "active_from",
                            "active_to", "has_findings", "q", "cursor", "limit", "order"}
    assert listing["limit"]["schema"]["maximum"] == MAX_PAGE
    assert listing["order"]["schema"]["enum"] == ["activity", "created", "tokens", "cost"]


def test_an_unknown_api_route_answers_in_the_error_shape(client_of):
    answer = client_of().get("/api/v1/no-such-route")
    assert answer.status_code == 404 and "error" in answer.json()
    assert client_of(None).request("POST", "/login", content=b"token=" + b"x" * 10_000).status_code == 413


def test_a_time_beyond_64_bits_is_a_422_naming_it(client_of):
    answer = client_of().get("/api/v1/sessions", params={"created_from": 2 ** 64})
    assert answer.status_code == 422 and "'created_from'" in answer.json()["error"]
    answer = client_of().get(f"/api/v1/dead-letters/{2 ** 64}")
    assert answer.status_code == 422 and "'letter_id'" in answer.json()["error"]


# ------------------------------------------------------------------ the viewer's pages

_ROW = re.compile(r'<tr class="session[^"]*" data-session="([^"]+)"')
_MESSAGE = re.compile(r'<li class="message ([^"]*)" data-seq="([^"]*)" data-id="([^"]+)"')


_CSRF = re.compile(r'<input type="hidden" name="csrf" value="([^"]+)">')


def sign_in(browser: _Client, token: str = TOKEN, then: str | None = None) -> httpx.Response:
    """Fill in and send the sign-in form as a browser does (its CSRF field from the form page)."""
    form = browser.get("/login", params={"next": then} if then else None)
    fields = {"token": token, "csrf": _CSRF.search(form.text).group(1)}
    fields.update(next=re.search(r'name="next" value="([^"]*)"', form.text).group(1).replace("&amp;", "&"))
    return browser.request("POST", "/login", data=fields)


def signed_in(client_of, **options: Any) -> _Client:
    browser = client_of(None, **options)
    assert browser.get("/").headers["location"] == "/login?next=%2F"
    refused = sign_in(browser, "not-a-token")
    assert refused.status_code == 401 and SESSION_COOKIE not in refused.cookies
    signed = sign_in(browser)
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"]
    assert TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=" in cookie
    return browser


def test_the_session_list_shows_the_fleet_over_pages_and_filters_it(client_of, reader):
    browser = signed_in(client_of)
    first = browser.get("/")
    assert first.status_code == 200
    shown = _ROW.findall(first.text)
    following = re.search(r'<a href="([^"]+)" rel="next"', first.text)
    assert len(shown) == 50 and following
    shown += _ROW.findall(browser.get(following.group(1).replace("&amp;", "&")).text)
    assert shown == [s["sessionId"] for s in reader.sessions(SessionFilter(), limit=10_000)["items"]]

    held = browser.get("/", params={"status": "held", "q": "needle"})
    expected = [s["sessionId"] for s in reader.sessions(SessionFilter(status=("held",), text="needle"))["items"]]
    assert _ROW.findall(held.text) == expected and 0 < len(expected) < 50
    assert 'value="held" checked' in held.text and 'rel="next"' not in held.text


def test_a_conversation_shows_every_message_escaped_with_its_finding(client_of, reader):
    session = reader.session("s-rich")
    page = signed_in(client_of).get("/sessions/s-rich")
    assert page.status_code == 200
    shown = _MESSAGE.findall(page.text)
    assert [message_id for _, _, message_id in shown] == [m["id"] for m in session["messages"]]
    assert [seq for _, seq, _ in shown] == [str(session["messageSeqs"][m["id"]]) for m in session["messages"]]
    assert [kind.split()[0] for kind, _, _ in shown] == ["user", "assistant", "tool", "other"]
    assert INJECTED not in page.text and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text
    assert re.search(r'<details class="reasoning"><summary>reasoning</summary><div class="text">'
                     r'the tests live in tests/</div></details>', page.text)
    assert "{\n  &#34;command&#34;: &#34;pytest&#34;\n}" in page.text and "2 failed" in page.text  # JSON indented
    assert '<a class="answered failed" href="#seq-8">failed at seq 8</a>' in page.text  # the call leads to its result
    assert "<td>error</td>" in page.text  # turn 2 ended in an error
    flagged = [chunk for chunk in page.text.split('<li class="message')[1:] if 'class="finding' in chunk]
    assert len(flagged) == 1 and 'data-id="a-1"' in flagged[0]  # seq 6: the last message at or before it is seq 5
    # each request header change where it was logged: before u-1 (seq 2), between t-1 (8) and c-1 (12)
    order = re.findall(r'<li class="(header-change|message [a-z]+[^"]*)" data-seq="(\d+)"', page.text)
    assert [seq for _, seq in order] == ["1", "2", "5", "8", "9", "12"]
    assert [kind for kind, _ in order].count("header-change") == 2
    first, second = page.text.split('<li class="header-change"')[1:3]
    assert "(initial)" in first and "tools added: shell" in first and "model = &#34;m-0&#34;" in first
    assert "be brief &lt;script&gt;" in first and "<summary>system prompt</summary>" in first
    assert "(change)" in second and "tools removed: shell" in second and "reasoningEffort = &#34;off&#34;" in second
    assert "system prompt" not in second.split("</li>")[0]
    audit = page.text.split('id="audit">')[1].split("</p>")[0]
    assert audit == "audit: 1 attested mismatch, 2 attested verified; gateway agent: 1 unlogged"


def test_an_unknown_session_page_is_a_404_naming_it(client_of):
    missing = signed_in(client_of).get("/sessions/s-nowhere")
    assert missing.status_code == 404 and "No session s-nowhere" in missing.text
