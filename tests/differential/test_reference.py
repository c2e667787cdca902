"""Differential tests: our dsh_core against the reference implementation.

Hypothesis draws random valid logs and single mutations of them; both
implementations must agree on accept/reject, surface, derived messages,
folded request header and context, and on packed-row encoding (bytes) and
decoding. Cases are drawn first, then sent to Node in one batch per test.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from dsh_core.errors import ValidationError
from dsh_core.jsonvalue import encode_json, thaw
from dsh_core.session import SessionLog
from dsh_core.storage.records import decode_row, decode_row_line, pack_chunk_runs
from dsh_core.errors import DecodeError
from tests.conftest import canonical
from tests.differential.reference import run_reference, unavailable_reason
from tests.strategies import mutated_logs, session_logs

_reason = unavailable_reason()
pytestmark = [pytest.mark.reference, pytest.mark.skipif(_reason is not None, reason=_reason or "")]

CASES = 300


def _draw_many(strategy: Any, count: int, draw_seed: int) -> list[Any]:
    drawn: list[Any] = []

    @seed(draw_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: Any) -> None:
        drawn.append(value)

    collect()
    return drawn


def _ours(events: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        log = SessionLog("prop-session", copy.deepcopy(events), clock=lambda: 0)
    except ValidationError as exc:
        return {"accepted": False, "message": str(exc)}
    return {"accepted": True, "events": len(log.events), "surfaceNodes": list(log.surface_nodes),
            "replaceGeneration": log.replace_generation, "derivedMessages": thaw(log.derive_messages()),
            "requestHeader": thaw(log.request_header()), "requestContext": thaw(log.request_context())}


def _compare(cases: list[tuple[str, list]], results: list[dict]) -> dict[str, int]:
    counts = {"accepted": 0, "rejected": 0}
    for (name, events), theirs in zip(cases, results):
        ours = _ours(events)
        assert ours["accepted"] == theirs["accepted"], (name, ours.get("message"), theirs.get("message"))
        if ours["accepted"]:
            counts["accepted"] += 1
            for key in ("events", "surfaceNodes", "replaceGeneration", "derivedMessages", "requestHeader",
                        "requestContext"):
                assert canonical(ours[key]) == canonical(theirs[key]), (name, key)
        else:
            counts["rejected"] += 1
    return counts


def test_random_valid_logs_agree():
    logs = _draw_many(session_logs(), CASES, draw_seed=1)
    cases = [("valid", events) for events in logs]
    counts = _compare(cases, run_reference("seed", [{"id": "prop-session", "events": e} for _, e in cases]))
    assert counts["accepted"] == len(cases)


def test_random_mutations_agree():
    cases = _draw_many(mutated_logs(), CASES, draw_seed=2)
    counts = _compare(cases, run_reference("seed", [{"id": "prop-session", "events": e} for _, e in cases]))
    assert counts["rejected"] > CASES // 2  # most single mutations break a rule


def test_packing_agrees_byte_for_byte():
    logs = _draw_many(session_logs(), CASES // 2, draw_seed=3)
    theirs = run_reference("pack", [{"events": events} for events in logs])
    for events, their_records in zip(logs, theirs):
        ours = pack_chunk_runs(copy.deepcopy(events))
        assert b"\n".join(encode_json(r) for r in ours) == b"\n".join(
            encode_json(r) for r in their_records), "packed rows differ"
        # and the reference's own serialization is the same bytes
        assert [json.loads(encode_json(r)) for r in ours] == their_records


@st.composite
def rows(draw: Any) -> tuple[str | None, dict[str, Any]]:
    """A valid packed row, or one with a single random defect: (defect, row)."""
    tag = draw(st.sampled_from(["text-chunks", "reasoning-chunks", "tool-call-chunks"]))
    members = draw(st.lists(st.text(max_size=3), min_size=1, max_size=5))
    data: dict[str, Any] = {"turn": draw(st.integers(0, 3)), "step": draw(st.integers(0, 3)),
                            "index": draw(st.integers(0, 3)),
                            "dt": draw(st.lists(st.integers(-50, 50), min_size=len(members) - 1,
                                                max_size=len(members) - 1))}
    if tag == "tool-call-chunks":
        data["id"] = "c1"
        if draw(st.booleans()):
            data["name"] = "ls"
        data["args"] = members
    else:
        data["texts"] = members
    row = {"type": tag, "seq0": draw(st.integers(0, 10**6)), "time0": draw(st.integers(-(10**12), 10**12)),
           "data": data}
    defect = draw(st.sampled_from([None, None, "members-empty", "dt-short", "dt-fraction", "extra", "envelope",
                                   "turn-string", "time-overflow", "seq-overflow", "seq-negative", "name-number"]))
    key = "args" if tag == "tool-call-chunks" else "texts"
    match defect:
        case "members-empty":
            data[key], data["dt"] = [], []
        case "dt-short":
            data["dt"] = data["dt"][1:] if data["dt"] else [1]
        case "dt-fraction":
            data["dt"] = [0.5] + data["dt"][1:] if data["dt"] else [0.5]
        case "extra":
            data["extra"] = 1
        case "envelope":
            row["seq"] = 1
        case "turn-string":
            data["turn"] = "1"
        case "time-overflow":
            row["time0"] = 2**53 - 1 if data["dt"] and data["dt"][0] > 0 else 2**53
        case "seq-overflow":
            row["seq0"] = 2**53 - 1 if len(members) > 1 else 2**53
        case "seq-negative":
            row["seq0"] = -1
        case "name-number":
            data["name"] = 7
    return defect, row


def test_row_decoding_agrees():
    drawn = _draw_many(rows(), CASES, draw_seed=4)
    theirs = run_reference("decode", [{"records": [row]} for _, row in drawn])
    accepted = fast = 0
    for (defect, row), their in zip(drawn, theirs):
        try:
            decoded = decode_row(copy.deepcopy(row))
            ours = {"ok": True, "events": decoded.expand()}
        except DecodeError:
            decoded, ours = None, {"ok": False}
        # the one-pass line decoder takes a subset of the rows, to the same ChunkRow
        from_line = decode_row_line(encode_json(row))
        assert from_line is None or from_line == decoded, row
        fast += from_line is not None
        if defect == "seq-overflow" and len(row["data"].get("texts", row["data"].get("args"))) > 1:
            # docs/formats/v0.md §11: dsh checks seq0+n-1 in floating point and lets a row at
            # 2^53-1 pass; we use exact integers and reject it.
            assert not ours["ok"]
            continue
        assert ours["ok"] == their["ok"], (row, their)
        if ours["ok"]:
            accepted += 1
            assert canonical(ours["events"]) == canonical(their["events"])
    assert 0 < accepted < len(drawn) and fast == accepted
