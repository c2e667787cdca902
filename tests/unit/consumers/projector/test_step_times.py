"""Each step's event times and tokens in the view store: what the log says,
the same whether the projector ran once or restarted mid-session, and the
summary's tokens per hour counted by when the steps happened."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import zstandard

from consumers.projector import Projection, ProjectorConfig
from consumers.projector.store import TOKEN_COLUMNS
from consumers.projector.store_reader import StoreReader
from dsh_core.event_time import line_time
from dsh_core.formats.registry import read_header
from dsh_kafka.records import KIND_RECORD, header_record, record_from_line, writer_of
from producers.simulator import SimulatorConfig, simulate_session
from tests.conftest import ROOT
from tests.policy_driver import KAFKA, Fetched, run_batch
from tests.view_store_helpers import simulated_fleet

SHIPPED = 1_900_000_000_000  # when the records reached the topic: long after the logs were written


def _project(location, fleet, cut: int | None = None) -> StoreReader:
    """The fleet projected in one batch, or in two by two projectors (a
    restart after ``cut`` records of each session)."""
    parts = [[(records[:cut], records[cut:]) if cut else (records, [])] for _, records in fleet]
    for half in (0, 1):
        rows = [record for pair in parts for records in pair for record in records[half]]
        if rows:
            run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=location)),
                      [Fetched(r.key, r.value, r.headers, offset, timestamp=SHIPPED) for offset, r in enumerate(rows)])
    return StoreReader(location)


def _expected_steps(records) -> dict[tuple[int, int], dict[str, int | None]]:
    """Each step's start (its step/start), first output (its first chunk or
    streamed chunk) and end (its last event), read from the records."""
    steps: dict[tuple[int, int], dict[str, int | None]] = {}
    for record in records:
        found = line_time(record.value) if record.kind == KIND_RECORD else None
        if found is None or found.turn is None or found.step is None:
            continue
        step = steps.setdefault((found.turn, found.step), {"startedAt": None, "firstOutputAt": None, "endedAt": None})
        if found.type == "step/start" or step["startedAt"] is None:
            step["startedAt"] = found.first
        if step["firstOutputAt"] is None:
            step["firstOutputAt"] = found.output_at
        step["endedAt"] = max(step["endedAt"] or found.last, found.last)
    return steps


def test_steps_hold_the_logs_times_and_tokens_and_a_restart_changes_nothing(tmp_path):
    fleet = simulated_fleet(4, seed=91)
    once = _project(tmp_path / "once.sqlite", fleet)
    twice = _project(tmp_path / "twice.sqlite", fleet, cut=25)
    try:
        for truth, records in fleet:
            whole = once.session(truth.session_id)
            assert whole["steps"] == twice.session(truth.session_id)["steps"]
            steps = {(step["turn"], step["step"]): step for step in whole["steps"]}
            expected = _expected_steps(records)
            assert {key: {field: step[field] for field in ("startedAt", "firstOutputAt", "endedAt")}
                    for key, step in steps.items()} == expected
            assert all(step["durationMs"] == step["endedAt"] - step["startedAt"] for step in steps.values())
            assert all(step["timeToFirstOutputMs"] is not None for step in steps.values() if step["model"])
            totals = Counter()
            for step in steps.values():
                totals.update({kind: step[kind] for kind in TOKEN_COLUMNS})
            for kind in TOKEN_COLUMNS:
                assert totals[kind] == sum(model.get(kind, 0) for model in whole["models"])
            assert whole["tokens"] == sum(totals.values()) > 0
            assert whole["ingestedAt"] == SHIPPED and whole["lastActivity"] < SHIPPED
            page = once.session_page(truth.session_id, None, 1000)
            assert page["steps"] == whole["steps"]
            for turn in page["turns"]:  # from its first step's start to its last step's end (none: no step)
                own = [s for s in whole["steps"] if s["turn"] == turn["turn"]]
                assert turn["durationMs"] == (max(s["endedAt"] for s in own) - min(s["startedAt"] for s in own)
                                              if own else None)
            assert all(event["time"] is not None for event in page["surface"])
    finally:
        once.close()
        twice.close()


def test_the_summary_counts_tokens_in_the_hour_each_step_ended(tmp_path):
    fleet = simulated_fleet(4, seed=92)
    reader = _project(tmp_path / "views.sqlite", fleet)
    try:
        expected: Counter = Counter()
        for truth, _ in fleet:
            for step in reader.session(truth.session_id)["steps"]:
                if step["model"] is not None:
                    hour = step["endedAt"] // 3_600_000 * 3_600_000
                    expected.update({(hour, step["provider"], step["model"], kind): step[kind] for kind in TOKEN_COLUMNS})
        hours = reader.summary()["tokensByModelPerHour"]
        assert {(row["hour"], row["provider"], row["model"], kind): row[kind]
                for row in hours for kind in TOKEN_COLUMNS} == {key: value for key, value in expected.items()} | {
            (row["hour"], row["provider"], row["model"], kind): 0 for row in hours for kind in TOKEN_COLUMNS
            if (row["hour"], row["provider"], row["model"], kind) not in expected}
        assert all(row["hour"] < SHIPPED - 3_600_000 for row in hours)
        assert json.dumps(hours)  # plain JSON
    finally:
        reader.close()


def test_the_cost_counter_adds_what_each_priced_message_cost(tmp_path):
    from prometheus_client import REGISTRY

    fleet = simulated_fleet(3, seed=93)

    def price(provider: str, model: str, usage) -> float | None:  # a dollar a million input tokens, one model only
        return usage.get("inputTokens", 0) / 1e6 if model == "deepseek-chat" else None

    def counted(model: str) -> float:
        return REGISTRY.get_sample_value("dsh_cost_usd_total", {"provider": "deepseek", "model": model}) or 0.0

    before = {model: counted(model) for model in ("deepseek-chat", "deepseek-reasoner")}
    rows = [Fetched(r.key, r.value, r.headers, offset, timestamp=SHIPPED)
            for offset, r in enumerate(r for _, records in fleet for r in records)]
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=tmp_path / "views.sqlite", price=price)), rows)
    reader = StoreReader(tmp_path / "views.sqlite")
    try:
        inputs = sum(model.get("inputTokens", 0) for truth, _ in fleet
                     for model in reader.session(truth.session_id)["models"] if model["model"] == "deepseek-chat")
    finally:
        reader.close()
    assert inputs > 0
    assert counted("deepseek-chat") - before["deepseek-chat"] == pytest.approx(inputs / 1e6)
    assert counted("deepseek-reasoner") == before["deepseek-reasoner"]  # no price: nothing counted


def _fixture_sessions() -> list:
    """dsh 0.1.5's own v3 logs (compactions among them), as the shipper sends them."""
    fleet = []
    for path in sorted((ROOT / "tests" / "fixtures" / "dsh-0.1.5").glob("*.v3.jsonl.zstd")):
        with path.open("rb") as file:
            lines = zstandard.ZstdDecompressor().stream_reader(file, read_across_frames=True).read().splitlines()
        parsed = json.loads(lines[0])  # read where dsh keeps it: v3 readers check the folder is the session's id
        header = read_header(lines[0], f"/sessions/p/{parsed['id']}/session.v3.jsonl")
        fleet.append((SimpleNamespace(session_id=header.id), [header_record(header)] + [
            record_from_line(header.id, line, header.version, writer_of(header)) for line in lines[1:]]))
    return fleet


@pytest.mark.parametrize("log_format", [0, 3, 4, "dsh-0.1.5"])
def test_each_surface_event_has_the_time_of_the_logged_event_of_its_seq(tmp_path, log_format):
    """A record's surface rows are timed by the fold's count after it; in a
    v3 log (migrated as it is folded: the simulator's and dsh 0.1.5's own)
    and v0 and v4 alike, that is the seq the log gave the event."""
    if log_format == "dsh-0.1.5":
        fleet = _fixture_sessions()
    else:
        config = SimulatorConfig(sessions=4, seed=81, formats=(log_format,), max_turns=4)
        fleet = []
        for index in range(config.sessions):
            truth, batches = simulate_session(config, index)
            fleet.append((truth, [record for batch in batches for record in batch]))
    reader = _project(tmp_path / "views.sqlite", fleet)
    try:
        checked = 0
        for truth, records in fleet:
            logged: dict[int, int] = {}
            for record in records:
                if record.kind != KIND_RECORD:
                    continue
                for line in record.value.splitlines():
                    event = json.loads(line)
                    if isinstance(event.get("seq"), int) and isinstance(event.get("time"), int):
                        logged[event["seq"]] = event["time"]
            surface = reader.session(truth.session_id)["surface"]
            assert surface
            for event in surface:
                assert event["time"] == logged.get(event["seq"]), (truth.session_id, event["seq"], event["type"])
                checked += 1
        assert checked > 20
    finally:
        reader.close()
