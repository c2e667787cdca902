"""The viewer's findings and dead-letter pages: behind sign-in, filtered as
the API filters, paged with the filters kept, every text escaped, each row
linking to its session, a letter's own page showing what it kept."""

from __future__ import annotations

import re

from dsh_pipeline.web import read_api
from tests.fake_reader import FakeReader
from tests.unit.dsh_pipeline.web.test_read_api import (BASE, INJECTED, TOKEN, _dead_letters, _findings, client_of, reader,  # noqa: F401
                                      signed_in)

_ROW = re.compile(r'<tr class="(finding|letter)-row"[^>]*data-(?:rule|reason)="([^"]*)"')


def _rows(html: str) -> list[str]:
    return [value for _, value in _ROW.findall(html)]


def test_the_lists_need_a_signed_in_browser(client_of):
    browser = client_of(None)
    for path in ("/findings", "/dead-letters", "/dead-letters/4", "/usage", "/timeline/s-rich"):
        sent = browser.get(path)
        assert sent.status_code == 303 and sent.headers["location"].startswith("/login?next=%2F"), path


def test_findings_are_listed_newest_first_and_filtered_as_the_api_filters(client_of):
    browser = signed_in(client_of)
    listed = browser.get("/findings")
    assert listed.status_code == 200
    newest_first = sorted(_findings(), key=lambda f: (f["at"], f["id"]), reverse=True)
    assert _rows(listed.text) == [f["rule"] for f in newest_first]
    assert INJECTED not in listed.text and "the request differs &lt;script&gt;" in listed.text
    assert '<a href="/sessions/s-rich">s-rich</a>' in listed.text
    drift = browser.get("/findings", params={"rule": "usage-drift", "severity": "warning"})
    expected = [f for f in newest_first if f["rule"] == "usage-drift" and f["severity"] == "warning"]
    assert _rows(drift.text) == ["usage-drift"] * len(expected) and expected
    assert 'value="usage-drift"' in drift.text and '<option value="warning" selected>' in drift.text
    one = browser.get("/findings", params={"session": "s-rich"})
    assert _rows(one.text) == ["request-mismatch"] and "seq 6, turn 1, step 2" in one.text
    assert "No finding matches." in browser.get("/findings", params={"rule": "no-such-rule"}).text
    assert _rows(browser.get("/findings", params={"severity": "not-a-severity"}).text) == _rows(listed.text)


def test_dead_letters_are_filtered_and_paged_with_the_filters_kept(client_of):
    letters = [{**letter, "id": index, "offset": index, "at": BASE + index, "copies": 1 + index % 2}
               for index, letter in enumerate(_dead_letters() * 20)]  # 340, 120 the auditor's
    browser = signed_in(client_of, app=read_api(FakeReader([], (), letters), frozenset({TOKEN})))
    shown, url, pages = [], "/dead-letters?service=auditor", 0
    while url:
        page = browser.get(url)
        assert page.status_code == 200
        shown += re.findall(r'data-letter="(\d+)"', page.text)
        pages += 1
        following = re.search(r'<a href="([^"]+)" rel="next"', page.text)
        url = following.group(1).replace("&amp;", "&") if following else None
        assert url is None or "service=auditor" in url
    auditor = [letter for letter in letters if letter["service"] == "auditor"]
    assert shown == [str(letter["id"]) for letter in sorted(auditor, key=lambda l: l["at"], reverse=True)]
    assert pages == -(-len(auditor) // 50) > 1
    reason = browser.get("/dead-letters", params={"reason": "corrupt-storage", "session": "s-001"})
    assert set(_rows(reason.text)) == {"corrupt-storage"}


def test_a_dead_letter_page_shows_what_it_kept_and_an_unknown_one_is_named(client_of):
    browser = signed_in(client_of)
    letter = next(letter for letter in _dead_letters() if letter["id"] == 4)
    page = browser.get("/dead-letters/4")
    assert page.status_code == 200
    assert f'<dd class="text" id="letter-error">{letter["detail"]}</dd>' in page.text
    assert '<pre class="head" id="letter-head">{&#34;type&#34;</pre>' in page.text
    assert f"{letter['topic']} partition {letter['partition']} offset {letter['offset']}" in page.text
    missing = browser.get("/dead-letters/999")
    assert missing.status_code == 404 and "No dead letter 999 in the view store." in missing.text
    assert browser.get("/dead-letters/-1").status_code == 422
    assert browser.get("/dead-letters/not-a-number").status_code == 422


def test_every_page_links_the_three_lists(client_of):
    browser = signed_in(client_of)
    for path in ("/", "/findings", "/dead-letters", "/sessions/s-rich", "/usage", "/timeline/s-rich"):
        assert '<nav class="sections"><a href="/">Sessions</a><a href="/findings">Findings</a>' \
               '<a href="/dead-letters">Dead letters</a><a href="/usage">Usage</a></nav>' in browser.get(path).text, path
    assert "Findings</a>" not in client_of(None).get("/login").text  # not before signing in


def test_the_usage_page_shows_each_hours_tokens_and_cost_by_model_newest_first(client_of, reader):
    html = signed_in(client_of).get("/usage").text
    hours = reader.summary()["tokensByModelPerHour"]
    shown = re.findall(r'<tr class="hour-row" data-hour="(\d+)" data-model="([^"]*)"', html)
    assert shown == [(str(row["hour"]), row["model"]) for row in reversed(hours)]
    assert '<meter min="0" max="' in html and "prices of " in html


def test_the_timeline_puts_each_tool_call_with_its_result_and_how_long_it_took(client_of):
    steps = [{"turn": 1, "step": 1, "startedAt": 1_000, "firstOutputAt": 1_800, "endedAt": 9_000,
              "durationMs": 8_000, "timeToFirstOutputMs": 800, "provider": "deepseek", "model": "m-0",
              "inputTokens": 10, "outputTokens": 5, "cacheReadTokens": 0, "cacheWriteTokens": 0, "reasoningTokens": 0}]
    call = {"id": "a-1", "role": "assistant", "source": {"kind": "model", "provider": "deepseek", "model": "m-0"},
            "content": [{"type": "tool-call", "id": "call-1", "name": "shell", "arguments": '{"cmd": ["ls"]}'}]}
    result = {"id": "t-1", "role": "user", "source": {"kind": "tool", "callId": "call-1"},
              "content": [{"type": "tool-result", "callId": "call-1", "content": [{"type": "text", "text": "a b"}]}]}
    session = {"sessionId": "s-tl", "status": "idle", "cwd": None, "createdAt": 500, "lastActivity": 9_000,
               "turnCount": 1, "messageCount": 2, "models": [], "error": None, "header": {}, "nextSeq": 9,
               "turns": [{"turn": 1, "reason": {"kind": "completed"}, "steps": 1}], "requestHeader": None,
               "requestHeaderChanges": [], "audit": None, "replaceGeneration": 0, "messages": [call, result],
               "messageSeqs": {"a-1": 3, "t-1": 6}, "steps": steps,
               # the gateway forwarded the step's request: its upstream answered after 0.4 s, done at 6.1 s
               "gatewayRequests": [("gw-1", 41, "agent", 200, "completed", 1_020, 400, 6_100)],
               "surface": [{"seq": 3, "type": "assistant/message", "time": 2_000,
                            "data": {"turn": 1, "step": 1, "message": call}},
                           {"seq": 6, "type": "tool/result", "time": 4_500, "data": {"turn": 1, "step": 1,
                                                                                      "message": result}}]}
    findings = [{"id": "0-1", "at": 1, "sessionId": "s-tl", "rule": "request-mismatch", "severity": "error",
                 "seq": 3, "turn": 1, "step": 1, "detail": "d"}]
    app = read_api(FakeReader([session], findings), frozenset({TOKEN}))
    html = signed_in(client_of, app=app).get("/timeline/s-tl").text
    step = html.split('<li class="step" data-step="1.1">')[1].split("</li>\n    \n    </ol>")[0]
    assert 'first output after <span class="first-output">0.8 s</span>' in step
    assert 'took <span class="duration">8.0 s</span>' in step
    assert '<li class="call" data-call="call-1">' in step and 'answered after <span class="duration">2.5 s</span>' in step
    assert '<pre>{\n  &#34;cmd&#34;: [\n    &#34;ls&#34;\n  ]\n}</pre>' in step and "<pre>a b</pre>" in step
    assert 'data-rule="request-mismatch"' in step  # the finding at the step it names
    assert ('<li class="gateway-request" data-arrival="41">through gateway gw-1 (request 41, HTTP 200, completed)'
            in step)
    assert 'upstream first byte after <span class="upstream-first-byte">0.4 s</span>' in step
    assert 'upstream took <span class="upstream-duration">6.1 s</span>' in step
    [api_step] = client_of(app=app).get("/api/v1/sessions/s-tl").json()["steps"]
    assert api_step["gateway"] == [{"gateway": "gw-1", "arrival": 41, "status": 200, "outcome": "completed",
                                    "receivedAt": 1_020, "upstreamFirstByteMs": 400, "upstreamMs": 6_100}]
