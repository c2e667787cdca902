"""The price table: what usage costs, by model and provider; a table that
is not one is named with its file and entry; the API and the viewer show
the costs, and no price is never shown as free."""

from __future__ import annotations

import datetime

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.prices import load_prices
from dsh_pipeline.web import read_api
from tests.fake_reader import FakeReader
from tests.unit.dsh_pipeline.web.test_read_api import TOKEN, _session, client_of, reader, signed_in  # noqa: F401 (fixtures)

TABLE = """taken = 2026-12-01
source = "a test"

[[price]]
model = "m-1"
input = 2.0
cache_read = 0.5
cache_write = 3.0
output = 10.0

[[price]]
model = "m-1"
provider = "reseller"
input = 4.0
output = 20.0
reasoning = 30.0
"""
USAGE = {"inputTokens": 1_000_000, "cacheReadTokens": 2_000_000, "cacheWriteTokens": 100_000,
         "outputTokens": 300_000, "reasoningTokens": 500_000}


def _table(tmp_path, text: str = TABLE):
    path = tmp_path / "prices.toml"
    path.write_text(text)
    return load_prices(path)


def test_usage_is_priced_by_kind_with_reasoning_at_the_output_price_unless_given(tmp_path):
    table = _table(tmp_path)
    assert table.taken == datetime.date(2026, 12, 1) and table.source == "a test"
    # 1 M x 2 + 2 M x 0.5 + 0.1 M x 3 + (0.3 M + 0.5 M) x 10
    assert table.cost("deepseek", "m-1", USAGE) == pytest.approx(11.3)
    # the provider's own entry wins: 1 M x 4 + 0.3 M x 20 + 0.5 M x 30 (no cache prices: 0)
    assert table.cost("reseller", "m-1", USAGE) == pytest.approx(25.0)
    assert table.cost("deepseek", "m-2", USAGE) is None  # no price: unknown, not free
    assert table.cost("deepseek", "m-1", {"inputTokens": True, "outputTokens": -5, "cacheReadTokens": "9"}) == 0


def test_the_packaged_table_prices_the_deepseek_models_a_log_names():
    table = load_prices()
    for model in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-chat", "deepseek-reasoner"):
        assert table.cost("deepseek-official", model, {"inputTokens": 1_000_000}) > 0, model
    assert table.taken.year >= 2026 and "deepseek" in table.source.lower()


@pytest.mark.parametrize(("text", "named"), [
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = 1\n", "Object missing required field `output`"),
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = 1\noutput = 'x'\n", "`$.price[0].output`"),
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = 1\noutput = 1\ninptu = 2\n",
     "unknown field `inptu`"),
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = -1\noutput = 1\n",
     "price[0] (m): a price is negative, infinite or not a number"),
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = 1\noutput = inf\n",
     "price[0] (m): a price is negative, infinite or not a number"),
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = 1\noutput = 1\nreasoning = nan\n",
     "price[0] (m): a price is negative, infinite or not a number"),
    ("taken = 2026-12-01\nsource = 's'\n[[price]]\nmodel = 'm'\ninput = 1\noutput = 1\n"
     "[[price]]\nmodel = 'm'\ninput = 1\noutput = 1\n", "price[1]: m is priced twice"),
    ("taken = \n", "not a TOML file"),
])
def test_a_table_that_is_not_one_is_named_with_its_entry(tmp_path, text, named):
    with pytest.raises(PipelineError) as refused:
        _table(tmp_path, text)
    assert str(tmp_path / "prices.toml") in refused.value.message and named in refused.value.message


def test_a_missing_table_is_named(tmp_path):
    with pytest.raises(PipelineError, match="cannot read the price table"):
        load_prices(tmp_path / "nowhere.toml")


def test_the_api_and_the_viewer_show_each_models_cost(client_of, tmp_path):
    session = _session(1) | {"sessionId": "s-priced", "models": [
        {"provider": "deepseek", "model": "m-1", **USAGE}, {"provider": "deepseek", "model": "m-9", "inputTokens": 5}]}
    cheap = _session(2) | {"sessionId": "s-cheap", "models": [{"provider": "deepseek", "model": "m-1",
                                                                "inputTokens": 1000, "outputTokens": 10}]}
    app = read_api(FakeReader([session, cheap]), frozenset({TOKEN}), prices=_table(tmp_path))
    api = client_of(app=app)
    models = api.get("/api/v1/sessions/s-priced").json()["models"]
    assert [model["costUsd"] for model in models] == [pytest.approx(11.3), None]
    listed = {item["sessionId"]: item for item in api.get("/api/v1/sessions").json()["items"]}
    assert listed["s-cheap"]["models"][0]["costUsd"] == pytest.approx(0.0021)
    summary = api.get("/api/v1/summary").json()
    assert summary["prices"] == {"taken": "2026-12-01", "source": "a test"}
    assert {row["costUsd"] for row in summary["tokensByModelPerHour"] if row["model"] == "m-9"} == {None}
    browser = signed_in(client_of, app=app)
    page = browser.get("/sessions/s-priced").text
    assert '<td class="cost">$11.30</td>' in page and '<td class="cost">no price</td>' in page
    rows = browser.get("/").text
    assert '<td data-label="Cost" class="cost">$0.0021</td>' in rows  # every model priced
    assert '<td data-label="Cost" class="cost">no price</td>' in rows  # one model without a price: no total
    assert '<td data-label="Tokens">1,010</td>' in rows


def _step(turn: int, step: int, started: int, model: str | None, **tokens: int) -> dict:
    ended, output = started + 4_000, started + 1_500
    return {"turn": turn, "step": step, "startedAt": started, "firstOutputAt": output, "endedAt": ended,
            "durationMs": ended - started, "timeToFirstOutputMs": output - started,
            "provider": "deepseek" if model else None, "model": model,
            **{kind: tokens.get(kind, 0) for kind in USAGE}}


def test_each_step_and_turn_has_its_cost_and_timings_in_the_api_and_the_viewer(client_of, tmp_path):
    steps = [_step(1, 1, 1_000_000, "m-1", inputTokens=1_000_000, outputTokens=100_000),  # $2 + $1
             _step(1, 2, 1_010_000, None),  # a step that asked no model: no cost of its own
             _step(2, 1, 1_020_000, "m-1", cacheReadTokens=2_000_000),  # $1
             _step(3, 1, 1_030_000, "m-9", inputTokens=5)]  # no price
    turns = [{"turn": n, "reason": {"kind": "completed"}, "steps": 1} for n in (1, 2, 3)]
    session = _session(1) | {"sessionId": "s-timed", "turns": turns, "steps": steps, "models": [
        {"provider": "deepseek", "model": "m-1", "inputTokens": 1_000_000, "outputTokens": 100_000,
         "cacheReadTokens": 2_000_000}, {"provider": "deepseek", "model": "m-9", "inputTokens": 5}]}
    app = read_api(FakeReader([session]), frozenset({TOKEN}), prices=_table(tmp_path))
    page = client_of(app=app).get("/api/v1/sessions/s-timed").json()
    assert [step["costUsd"] for step in page["steps"]] == [pytest.approx(3.0), None, pytest.approx(1.0), None]
    assert [turn["costUsd"] for turn in page["turns"]] == [pytest.approx(3.0), pytest.approx(1.0), None]
    assert [(turn["startedAt"], turn["durationMs"], turn["tokens"]) for turn in page["turns"]] == [
        (1_000_000, 14_000, 1_100_000), (1_020_000, 4_000, 2_000_000), (1_030_000, 4_000, 5)]
    assert page["costUsd"] is None  # one model has no price: no total
    browser = signed_in(client_of, app=app)
    html = browser.get("/sessions/s-timed").text
    assert '<tr data-step="1.1">' in html and '<td class="first-output">1.5 s</td>' in html
    assert '<td class="duration">14.0 s</td><td>1,100,000</td><td class="cost">$3.00</td>' in html


def test_the_list_sorts_by_the_cost_it_shows_and_refuses_a_cursor_of_another_order(client_of, tmp_path):
    sessions = [_session(n) | {"sessionId": f"s-{n}", "models": [{"provider": "deepseek", "model": "m-1",
                                                                    "inputTokens": 1000 * n, "outputTokens": 10}]}
                for n in (1, 2, 3)]
    sessions.append(_session(4) | {"sessionId": "s-unpriced", "models": [
        {"provider": "deepseek", "model": "m-1", **USAGE}, {"provider": "deepseek", "model": "m-9", "inputTokens": 5}]})
    app = read_api(FakeReader(sessions), frozenset({TOKEN}), prices=_table(tmp_path))
    api = client_of(app=app)
    first = api.get("/api/v1/sessions", params={"order": "cost", "limit": 2}).json()
    rest = api.get("/api/v1/sessions", params={"order": "cost", "cursor": first["next"]}).json()
    listed = [(item["sessionId"], item["costUsd"]) for item in first["items"] + rest["items"]]
    # 1000 n tokens x $2/M + 10 x $10/M; the session with a model of no price comes last, not as free
    assert listed == [("s-3", pytest.approx(0.0061)), ("s-2", pytest.approx(0.0041)),
                      ("s-1", pytest.approx(0.0021)), ("s-unpriced", None)]
    by_tokens = api.get("/api/v1/sessions", params={"order": "tokens", "limit": 1}).json()["next"]
    refused = api.get("/api/v1/sessions", params={"order": "cost", "cursor": by_tokens})
    assert refused.status_code == 422 and "pages the sessions by 'tokens', not by 'cost'" in refused.json()["error"]
    browser = signed_in(client_of, app=app)
    page = browser.get("/", params={"order": "cost"}).text
    assert '<option value="cost" selected>cost</option>' in page
    assert [page.index(f'data-session="{name}"') for name in ("s-3", "s-2", "s-1", "s-unpriced")] == sorted(
        page.index(f'data-session="{name}"') for name in ("s-3", "s-2", "s-1", "s-unpriced"))
