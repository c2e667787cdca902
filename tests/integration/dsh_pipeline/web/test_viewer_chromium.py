"""The transcript viewer in headless Chromium (Debian's, driven by
Playwright), on a laptop screen and a phone: a conversation asked for
before signing in opens after it, the session list shows the stored fleet,
a status filter narrows it, a conversation shows the messages ``view
--json`` prints a page of surface events at a time (by seq), a finding
sits at its message, a long text opens cut with a link to its whole
message, signing out ends the session, and the browser reports no
Content-Security-Policy violation on the way while the stylesheet applies.
A failing test leaves screenshots in ``test-artifacts/``."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from consumers.projector.store import ViewStore
from consumers.projector.session_pages import PREVIEW_CHARS
from consumers.projector.store_reader import StoreReader
from dsh_pipeline.cli import main
from dsh_pipeline.ops_server import OpsServer
from dsh_pipeline.web import read_api
from dsh_pipeline.web.app import API_LIMITS
from tests.view_store_helpers import stored_fleet

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (make test installs Debian's)")
ARTIFACTS = Path(__file__).resolve().parents[4] / "test-artifacts"
TOKEN = "viewer-test-token"
VIEWPORTS = {"laptop": {"width": 1366, "height": 768}, "phone": {"width": 390, "height": 844}}
PER_PAGE = 3  # messages a conversation's page shows (max_page), so the fleet's sessions take several


class _Served:
    """The viewer as ``serve`` runs it (its listener limits), on a free port
    in a thread of its own, while in ``with``."""

    def __init__(self, store: Path) -> None:
        self.reader = StoreReader(store)
        self.server = OpsServer(read_api(self.reader, frozenset({TOKEN}), max_page=PER_PAGE), "127.0.0.1", 0,
                                API_LIMITS)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def __enter__(self) -> "_Served":
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        self.reader.close()


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("viewer") / "views.sqlite"
    ids = [truth.session_id for truth, _ in stored_fleet(store)]
    return store, ids


@pytest.mark.parametrize("viewport", sorted(VIEWPORTS))
def test_the_viewer_lists_filters_and_shows_a_conversation(fleet_store, viewport, capsys):
    store, ids = fleet_store
    assert main(["view", ids[1], "--store", str(store), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    with _Served(store) as served, playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORTS[viewport])
        console = []
        page.on("console", lambda message: console.append(message.text))
        try:
            page.goto(f"{served.url}/sessions/{ids[1]}")
            assert "/login?next=" in page.url
            assert page.evaluate("getComputedStyle(document.querySelector('.bar')).backgroundColor") == \
                "rgb(29, 35, 48)"  # the package's stylesheet applies under the policy
            page.fill("#token", "not-the-token")
            page.click("button[type=submit]")
            assert "not one of this service's" in page.inner_text("main")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("#conversation")
            assert page.url == f"{served.url}/sessions/{ids[1]}"  # back where it was sent from

            shown, pages = [], 0
            while True:
                pages += 1
                on_page = page.locator("li.message").evaluate_all("items => items.map(i => i.dataset.id)")
                assert len(on_page) <= PER_PAGE  # a page of surface events, never the whole session
                shown += on_page
                if page.locator("#next").count() == 0:
                    break
                page.click("#next")
                page.wait_for_url("**after=**")
            events = served.reader.session_page(ids[1])["surfaceCount"]
            assert shown == [m["id"] for m in expected] and pages == -(-events // PER_PAGE) > 1
            page.goto(f"{served.url}/sessions/{ids[1]}")
            first_user = next(m for m in expected if m["role"] == "user")
            assert first_user["content"][0]["text"].strip() in page.locator("li.message").first.inner_text()
            flagged = page.locator("li.message.flagged")
            assert flagged.count() == 1
            finding = flagged.locator("aside.finding")
            assert finding.get_attribute("data-rule") == "request-mismatch"
            assert int(flagged.get_attribute("data-seq")) <= int(finding.get_attribute("data-seq"))
            assert finding.is_visible()

            page.goto(served.url + "/")
            rows = page.locator("tr.session")
            assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.session)")) == sorted(ids)
            page.check("input[name=status][value=held]")
            page.click("#filters button[type=submit]")
            page.wait_for_url("**status=held**")
            assert page.locator("tr.session").evaluate_all("rows => rows.map(r => r.dataset.session)") == [ids[-1]]

            page.click("#sign-out button")
            page.wait_for_url("**/login")
            page.goto(served.url + "/")
            assert "/login?next=" in page.url  # the session ended
            assert all(cookie["name"] != "dsh_session" for cookie in page.context.cookies())
            violations = [text for text in console if "Content Security Policy" in text or "Refused to" in text]
            assert violations == [], violations
        except BaseException:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"viewer-{viewport}-failure.png"), full_page=True)
            raise
        finally:
            browser.close()


def test_the_findings_and_dead_letter_pages_filter_and_lead_to_their_session(fleet_store, tmp_path):
    store, ids = fleet_store
    copy = tmp_path / "views.sqlite"
    copy.write_bytes(Path(store).read_bytes())
    views = ViewStore(copy)
    try:
        with views.database.transaction() as db:
            for offset, (service, reason) in enumerate((("projector", "invalid-log"), ("auditor", "corrupt-storage"))):
                db.execute("INSERT INTO dead_letters (topic, partition, \"offset\", service, reason, detail, "
                           "source_topic, source_partition, source_offset, session_id, seq, at, size, head) VALUES "
                           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           ("dsh.dead-letter", 0, offset, service, reason, f"{reason} at seq 4",
                            "dsh.session-events", 1, 40 + offset, ids[2], 4, 70 + offset, 9, b'{"seq":4}'))
    finally:
        views.close()
    with _Served(copy) as served, playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORTS["laptop"])
        console = []
        page.on("console", lambda message: console.append(message.text))
        try:
            page.goto(f"{served.url}/dead-letters?service=auditor")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("#dead-letters")
            rows = page.locator("tr.letter-row")
            assert rows.evaluate_all("rows => rows.map(r => r.dataset.reason)") == ["corrupt-storage"]
            page.select_option("select[name=service]", "")
            page.click("#filters button[type=submit]")
            page.wait_for_url("**/dead-letters?service=&**")
            assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.reason)")) == \
                ["corrupt-storage", "invalid-log"]
            page.click("tr.letter-row[data-reason=invalid-log] a.letter-link")
            page.wait_for_selector("#letter")
            assert page.inner_text("#letter-head") == '{"seq":4}'
            assert page.inner_text("#letter-error") == "invalid-log at seq 4"

            page.click("nav.sections >> text=Findings")
            page.wait_for_selector("#findings")
            page.fill("input[name=rule]", "request-mismatch")
            page.click("#filters button[type=submit]")
            page.wait_for_url("**rule=request-mismatch**")
            findings = page.locator("tr.finding-row")
            assert findings.evaluate_all("rows => rows.map(r => r.dataset.session)") == [ids[1]]
            findings.locator("a").click()
            page.wait_for_selector("#conversation")
            assert page.url == f"{served.url}/sessions/{ids[1]}"
            violations = [text for text in console if "Content Security Policy" in text or "Refused to" in text]
            assert violations == [], violations
        except BaseException:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "viewer-lists-failure.png"), full_page=True)
def test_a_long_text_opens_cut_and_its_whole_message_a_click_away(tmp_path):
    store = tmp_path / "views.sqlite"
    session_id = stored_fleet(store, count=2)[0][0].session_id
    long_text = "".join(f"line {n} of a long tool output\n" for n in range(2_000))  # 60 KB
    with sqlite3.connect(store) as db:
        seq, data = db.execute("SELECT seq, data FROM surface WHERE session_id = ? AND type = 'user/message' "
                               "ORDER BY seq LIMIT 1", (session_id,)).fetchone()
        message = json.loads(data)
        message["content"] = [{"type": "text", "text": long_text}]
        db.execute("UPDATE surface SET data = ? WHERE session_id = ? AND seq = ?",
                   (json.dumps(message), session_id, seq))
    with _Served(store) as served, playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORTS["laptop"])
        try:
            page.goto(f"{served.url}/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.goto(f"{served.url}/sessions/{session_id}")
            cut = page.locator(f"li.message[data-seq='{seq}']")
            assert cut.locator(".text").inner_text() == long_text[:PREVIEW_CHARS]
            assert f"({len(json.dumps(message, separators=(',', ':')))} bytes in all)" in cut.inner_text()
            cut.locator("a.whole").click()
            page.wait_for_url(f"**seq={seq}")
            assert page.locator("li.message .text").inner_text().rstrip("\n") == long_text.rstrip("\n")
        except BaseException:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "viewer-long-text-failure.png"), full_page=True)
            raise
        finally:
            browser.close()


def test_the_timeline_and_usage_pages_show_the_logs_times_steps_and_tool_calls(fleet_store):
    """From a conversation to its timeline: every step of the page's turns
    with its timings from the log, each tool call with its result and how
    long it took; then the usage page, each hour's tokens by model. No
    Content-Security-Policy violation on the way."""
    store, ids = fleet_store
    with _Served(store) as served, playwright.sync_playwright() as driver:
        expected = served.reader.session_page(ids[1], None, PER_PAGE)
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORTS["laptop"])
        console = []
        page.on("console", lambda message: console.append(message.text))
        try:
            page.goto(f"{served.url}/sessions/{ids[1]}")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("#conversation")
            page.click("#timeline-link")
            page.wait_for_selector("#timeline")
            shown = page.locator("li.step").evaluate_all("steps => steps.map(s => s.dataset.step)")
            assert shown and shown == [f"{step['turn']}.{step['step']}" for step in expected["steps"]]
            durations = page.locator("li.step .duration").all_inner_texts()
            assert durations[0] == f"{expected['steps'][0]['durationMs'] / 1000:.1f} s"
            calls = page.locator("li.call")
            for index in range(calls.count()):  # each call answered on the page says how long after
                call = calls.nth(index)
                assert "answered after" in call.inner_text() or "no result on this page" in call.inner_text()
            assert page.locator("details.arguments").count() == calls.count()

            page.click("nav.sections >> text=Usage")
            page.wait_for_selector("#usage")
            rows = page.locator("tr.hour-row").evaluate_all("rows => rows.map(r => [r.dataset.hour, r.dataset.model])")
            hours = served.reader.summary()["tokensByModelPerHour"]
            assert rows == [[str(row["hour"]), row["model"]] for row in reversed(hours)] and rows
            violations = [text for text in console if "Content Security Policy" in text or "Refused to" in text]
            assert violations == [], violations
        except BaseException:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "viewer-timeline-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
