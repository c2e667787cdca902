"""The transcript viewer in headless Chromium (Debian's, driven by
Playwright), on a laptop screen and a phone: a conversation asked for
before signing in opens after it, the session list shows the stored fleet,
a status filter narrows it, a conversation shows the messages ``view
--json`` prints a page at a time, a finding sits at its message, signing
out ends the session, and the browser reports no Content-Security-Policy
violation on the way while the stylesheet applies. A failing test leaves screenshots in ``test-artifacts/``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

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
                shown += page.locator("li.message").evaluate_all("items => items.map(i => i.dataset.id)")
                if page.locator("#next").count() == 0:
                    break
                page.click("#next")
                page.wait_for_url("**after=**")
            assert shown == [m["id"] for m in expected] and pages == -(-len(expected) // PER_PAGE) > 1
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
