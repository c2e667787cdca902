"""Streaming invariant checker (docs/formats/v0.md §7.1)."""

from __future__ import annotations

from dsh_core.invariants import InvariantChecker
from tests.unit.helpers import tool_result


def run(events):
    checker = InvariantChecker()
    found = []
    for seq, (event_type, data, *op) in enumerate(events):
        found += checker.check(event_type, seq, data, op[0] if op else "append")
    return [(v.rule, v.seq) for v in found]


def test_turn_numbering():
    assert run([("turn/start", {"turn": 1}), ("turn/start", {"turn": 2})]) == [("turn-open", 1)]
    assert run([("turn/start", {"turn": 1}), ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
                ("turn/start", {"turn": 3})]) == [("turn-number", 2)]


def test_turn_end_with_open_step_and_step_numbering():
    assert run([("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}),
                ("turn/end", {"turn": 1, "reason": {"kind": "completed"}})]) == [("turn-end-step-open", 2)]
    assert run([("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}),
                ("step/end", {"turn": 1, "step": 1}), ("step/start", {"turn": 1, "step": 3})]) == [("step-number", 3)]


def test_chunk_outside_step():
    assert run([("turn/start", {"turn": 1}),
                ("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "finish"}})]) == [("outside-step", 1)]


def test_tool_pairing():
    base = [("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1}),
            ("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "ls", "arguments": "{}"}),
            ("step/end", {"turn": 1, "step": 1}), ("step/start", {"turn": 1, "step": 2})]
    assert run(base + [("tool/result", tool_result("t", "c1", step=2))]) == [("tool-result-unpaired", 5)]
    not_started = tool_result("t", "c9", step=2, error={"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"})
    not_started["message"]["content"][0]["isError"] = True
    assert run(base + [("tool/result", not_started)]) == []
    twice = base[:3] + [("tool/result", tool_result("t", "c1")), ("tool/result", tool_result("u", "c1"))]
    assert run(twice) == [("tool-result-unpaired", 4)]


def test_turn_scoped_and_free_events():
    assert run([("request/context", {"provider": "p", "model": "m"}), ("todo/write", {"todos": []})]) == [
        ("outside-turn", 0), ("outside-turn", 1)]
    assert run([("user/message", {}), ("session/title", {"title": "t"}), ("session/end-seed", {})]) == []


def test_tool_result_rewrite_scope():
    replace = {"op": "replace", "start": 0, "end": 0}
    assert run([("turn/start", {"turn": 1}), ("tool/result", tool_result("t", "c1", turn=0), replace)]) == []
    assert run([("tool/result", tool_result("t", "c1"), replace)]) == [("rewrite-outside-turn", 0)]


def test_every_violation_reported_and_checker_continues():
    found = run([("turn/start", {"turn": 2}), ("step/start", {"turn": 2, "step": 2}),
                 ("step/end", {"turn": 2, "step": 2}), ("turn/end", {"turn": 2, "reason": {"kind": "completed"}}),
                 ("turn/start", {"turn": 3})])
    assert found == [("turn-number", 0), ("step-number", 1)]


def test_chunk_run_reports_what_its_members_would():
    prefixes = {
        "in step": [("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1})],
        "no step": [("turn/start", {"turn": 1})],
        "other step": [("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 2})],
    }
    for name, prefix in prefixes.items():
        one_by_one, packed = InvariantChecker(), InvariantChecker()
        for seq, (event_type, data) in enumerate(prefix):
            one_by_one.check(event_type, seq, data)
            packed.check(event_type, seq, data)
        seq0 = len(prefix) + 3  # also exercises seq-order bookkeeping across the run
        expected = [v for seq in range(seq0, seq0 + 4)
                    for v in one_by_one.check("assistant/chunk", seq, {"turn": 1, "step": 1})]
        assert packed.check_chunk_run(1, 1, seq0, 4) == expected, name
        assert packed.last_seq == one_by_one.last_seq == seq0 + 3
    assert [v.rule for v in InvariantChecker().check_chunk_run(1, 1, 0, 3)] == ["outside-step"] * 3
