"""A gateway's attestation as the row the projector keeps, and its
placement at the step whose time span holds it."""

from __future__ import annotations

from consumers.projector.gateway_requests import placed, request_row
from dsh_core.jsonvalue import encode_json


def _step(turn: int, step: int, started: int | None, ended: int | None) -> dict:
    return {"turn": turn, "step": step, "startedAt": started, "endedAt": ended}


def test_an_attestation_is_kept_with_its_upstream_timings_and_anything_else_is_no_row():
    value = encode_json({"gateway": "h:1", "arrival": 7, "kind": "agent", "status": 200, "outcome": "completed",
                         "receivedAt": 1_000_500, "upstream": {"firstByteMs": 412.6, "durationMs": 5120.2},
                         "digest": "d"})
    assert request_row(7, value) == ("h:1", 7, "agent", 200, "completed", 1_000_500, 413, 5120)
    unanswered = encode_json({"gateway": "h:1", "kind": "agent", "status": None, "outcome": "upstream-unreachable",
                              "receivedAt": 5})
    assert request_row(8, unanswered) == ("h:1", 8, "agent", None, "upstream-unreachable", 5, None, None)
    odd = encode_json({"gateway": "g" * 500, "kind": ["x"], "status": True, "outcome": 3, "receivedAt": -4,
                       "upstream": {"firstByteMs": 2 ** 60, "durationMs": "soon"}})
    assert request_row(9, odd) == ("g" * 200, 9, "['x']", None, "3", None, None, None)
    for value in (b"not json", b"[1, 2]", encode_json({"arrival": 3})):
        assert request_row(1, value) is None


def test_each_agent_request_goes_to_the_step_whose_span_holds_it():
    steps = [_step(1, 1, 1_000, 2_000), _step(1, 2, 2_500, 9_000), _step(1, 3, 3_000, 3_500), _step(2, 1, None, None)]
    rows = [("g", 1, "agent", 200, "completed", 1_500, 10, 400),
            ("g", 2, "agent", 500, "completed", 2_600, 5, 6),  # a retried request of step 2
            ("g", 3, "agent", 200, "completed", 2_700, 7, 800),
            ("g", 4, "agent", 200, "completed", 3_200, 9, 90),  # step 3 runs inside step 2: the later start wins
            ("g", 5, "agent", 200, "completed", 4_000, 9, 90),  # step 3 is over: step 2 still runs
            ("g", 6, "title", 200, "completed", 1_600, 1, 2),  # a title request is no step's
            ("g", 7, "agent", 200, "completed", 2_200, 1, 2),  # between steps: no step's
            ("g", 8, "agent", None, "upstream-unreachable", None, None, None)]
    shown = placed(steps, rows)
    assert [[request["arrival"] for request in step["gateway"]] for step in shown] == [[1], [2, 3, 5], [4], []]
    assert shown[0]["gateway"] == [{"gateway": "g", "arrival": 1, "status": 200, "outcome": "completed",
                                    "receivedAt": 1_500, "upstreamFirstByteMs": 10, "upstreamMs": 400}]
    assert [{key: value for key, value in step.items() if key != "gateway"} for step in shown] == steps
