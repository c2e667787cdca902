"""SessionLog append/seed/fork, surface and derivation."""

from __future__ import annotations

import pytest

from dsh_core.errors import EnvelopeError, ForkError, LosslessJsonError, MessageShapeError, SurfaceError
from dsh_core.events import Event
from dsh_core.session import SessionLog, SessionState
from dsh_core.surface import fold_surface
from tests.unit.helpers import Clock, assistant, new_log, tool_result, user


def test_append_assigns_seq_and_time_and_detaches():
    clock = Clock()
    log = SessionLog("s", clock=clock)
    data = {"turn": 1}
    event = log.append("turn/start", data)
    data["turn"] = 99
    assert (event.seq, event.data["turn"], log.seq) == (0, 1, 1)
    assert event.time == clock.now
    with pytest.raises(TypeError):
        event.data["turn"] = 2


def test_unknown_type_and_null_data_accepted_by_the_log():
    log = new_log()
    log.append("future/x", None)
    log.append("plugin/thing", {"a": [1, 2]})
    assert [e.type for e in log.events] == ["future/x", "plugin/thing"]


def test_refused_append_leaves_log_unchanged():
    log = new_log()
    log.append("turn/start", {"turn": 1})
    before = (log.events, log.surface_nodes, log.seq)
    with pytest.raises(LosslessJsonError, match=r"seq 1 \"turn/end\": negative zero at \$\.x\[0\]"):
        log.append("turn/end", {"x": [-0.0]})
    with pytest.raises(SurfaceError):
        log.append("user/message", user("m1"))
    assert (log.events, log.surface_nodes, log.seq) == before


@pytest.mark.parametrize("op", ["prepend", None, {"op": "replace", "start": 0, "end": 0, "x": 1},
                                {"op": "replace", "start": "0", "end": 0}, {"op": "replace", "start": -1, "end": 0},
                                [0, 0]])
def test_invalid_surface_op_rejected(op):
    log = new_log()
    log.append("user/message", user("m0"), surface_op="append")
    with pytest.raises(SurfaceError):
        log.append("user/message", user("m1"), surface_op=op)


def test_non_surface_types_cannot_carry_surface_fields():
    log = new_log()
    with pytest.raises(SurfaceError, match="not surface-eligible and cannot carry surfaceOp"):
        log.append("turn/start", {"turn": 1}, surface_op="append")
    with pytest.raises(SurfaceError, match="cannot carry sourceEventSeqs"):
        log.append("session/title", {"title": "x"}, source_event_seqs=[0])


def test_source_event_seqs_rules():
    log = new_log()
    log.append("turn/start", {"turn": 1})
    with pytest.raises(SurfaceError, match="must not be empty"):
        log.append("user/message", user("m"), surface_op="append", source_event_seqs=[])
    log.append("assistant/message", assistant("a", content=[]), surface_op="append", source_event_seqs=[])
    for bad in ["0", [0, 0], [0.5], [-1], [2], [5]]:
        with pytest.raises(SurfaceError):
            log.append("user/message", user("m"), surface_op="append", source_event_seqs=bad)
    log.append("user/message", user("m"), surface_op="append", source_event_seqs=[1, 0])


def _surface_log() -> SessionLog:
    log = new_log()
    log.append("turn/start", {"turn": 1})                                    # 0
    log.append("user/message", user("u1"), surface_op="append")              # 1
    log.append("assistant/message", assistant("a1"), surface_op="append")    # 2
    log.append("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "ls", "arguments": "{}"})  # 3
    log.append("tool/result", tool_result("t1", "c1", meta={"k": 1}), surface_op="append", source_event_seqs=[3])  # 4
    return log


def test_replace_rules():
    log = _surface_log()
    with pytest.raises(SurfaceError, match="start seq 0 not found"):
        log.append("user/message", user("s"), surface_op={"op": "replace", "start": 0, "end": 1}, source_event_seqs=[0])
    with pytest.raises(SurfaceError, match=r"start seq 2 \(index 1\) is after end seq 1"):
        log.append("user/message", user("s"), surface_op={"op": "replace", "start": 2, "end": 1}, source_event_seqs=[1, 2])
    with pytest.raises(SurfaceError, match="missing 2"):
        log.append("user/message", user("s"), surface_op={"op": "replace", "start": 1, "end": 2}, source_event_seqs=[1])
    with pytest.raises(SurfaceError, match="missing 1, 2"):
        log.append("user/message", user("s"), surface_op={"op": "replace", "start": 1, "end": 2})
    summary = log.append("user/message", user("s"), surface_op={"op": "replace", "start": 1, "end": 2},
                         source_event_seqs=[3, 2, 1])
    assert log.surface_nodes == (summary.seq, 4)
    assert log.replace_generation == 1
    assert [m["id"] for m in log.derive_messages()] == ["s", "t1"]
    with pytest.raises(SurfaceError, match="start seq 1 not found"):  # already shadowed
        log.append("user/message", user("x"), surface_op={"op": "replace", "start": 1, "end": 1}, source_event_seqs=[1])


def test_tool_result_rewrite_rules():
    log = _surface_log()
    replace = {"op": "replace", "start": 4, "end": 4}
    with pytest.raises(SurfaceError, match="exactly one current node"):
        log.append("tool/result", tool_result("t1", "c1"), surface_op={"op": "replace", "start": 2, "end": 4},
                   source_event_seqs=[2, 4])
    with pytest.raises(SurfaceError, match="must target a current tool/result"):
        log.append("tool/result", tool_result("u1", "c1"), surface_op={"op": "replace", "start": 1, "end": 1},
                   source_event_seqs=[1])
    for changed in [tool_result("t2", "c1", meta={"k": 1}), tool_result("t1", "c1"),
                    tool_result("t1", "c1", turn=2, meta={"k": 1})]:
        with pytest.raises(SurfaceError, match="may change only content"):
            log.append("tool/result", changed, surface_op=replace, source_event_seqs=[4])
    flipped = tool_result("t1", "c1", meta={"k": 1})
    flipped["message"]["content"][0]["isError"] = True
    with pytest.raises(SurfaceError, match="may change only content"):
        log.append("tool/result", flipped, surface_op=replace, source_event_seqs=[4])
    trimmed = log.append("tool/result", tool_result("t1", "c1", text="trimmed", meta={"k": 1.0}),
                         surface_op=replace, source_event_seqs=[4])
    assert log.surface_nodes == (1, 2, trimmed.seq)
    again = log.append("tool/result", tool_result("t1", "c1", text="shorter", meta={"k": 1}),
                       surface_op={"op": "replace", "start": trimmed.seq, "end": trimmed.seq},
                       source_event_seqs=[trimmed.seq])
    assert log.surface_nodes == (1, 2, again.seq) and log.replace_generation == 2


def test_replace_keeps_model_order_and_records_shadowed():
    log = new_log()
    for i in range(4):
        log.append("user/message", user(f"m{i}"), surface_op="append")
    summary = log.append("user/message", user("s"), surface_op={"op": "replace", "start": 1, "end": 2},
                         source_event_seqs=[1, 2])
    assert log.surface_nodes == (0, summary.seq, 3)
    nodes, replacements = fold_surface(list(log.events))
    assert nodes == [0, 4, 3]
    assert [(r.seq, r.shadowed_seqs) for r in replacements] == [(4, (1, 2))]
    later = log.append("user/message", user("t"), surface_op={"op": "replace", "start": 4, "end": 4},
                       source_event_seqs=[4])
    assert log.surface_nodes == (0, later.seq, 3)



def test_state_views_follow_the_surface():
    state = SessionState("s")
    for seq, mid in enumerate("ab"):
        state.check_and_apply({"type": "user/message", "seq": seq, "time": seq, "data": user(mid), "surfaceOp": "append"})
    events = state.surface_events()
    assert [m["id"] for m in state.current_messages()] == ["a", "b"]
    assert state.current_messages() is state.current_messages()  # the cached list, no copy
    state.check_and_apply({"type": "user/message", "seq": 2, "time": 2, "data": user("s"),
                           "surfaceOp": {"op": "replace", "start": 0, "end": 1}, "sourceEventSeqs": [0, 1]})
    assert list(events) == [2] and events[2][0] == "user/message" and events[2][1]["id"] == "s"
    assert [m["id"] for m in state.current_messages()] == ["s"]
    with pytest.raises(TypeError):
        events[3] = ("user/message", user("x"))  # type: ignore[index]

def test_derivation_rules():
    log = new_log()
    log.append("user/message", user("u", content=None) | {"content": []}, surface_op="append")
    log.append("assistant/message", assistant("empty", content=[]), surface_op="append", source_event_seqs=[])
    log.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}})
    log.append("request/header", {"header": {"config": {"provider": "p", "model": "m"}}, "reason": "initial"})
    messages = log.derive_messages()
    assert [m["id"] for m in messages] == ["u"]
    assert log.surface_nodes == (0, 1)
    log.append("user/message", user("v", extra=1), surface_op="append")
    assert len(messages) == 1  # an earlier list never grows
    latest = log.derive_messages()
    assert latest[1] == user("v", extra=1) | {"content": ({"type": "text", "text": "hi"},)}
    with pytest.raises(TypeError):
        latest[1]["id"] = "changed"


def test_message_shapes_checked_at_append():
    log = new_log()
    with pytest.raises(MessageShapeError, match="lacks an identified message"):
        log.append("user/message", {"role": "user", "content": [], "source": {"kind": "user"}}, surface_op="append")
    bad = assistant("a")
    bad["message"]["source"] = {"kind": "user"}
    with pytest.raises(MessageShapeError, match="model"):
        log.append("assistant/message", bad, surface_op="append")
    mismatched = tool_result("t", "c1")
    mismatched["message"]["content"][0]["toolCallId"] = "c2"
    with pytest.raises(MessageShapeError, match="does not match"):
        log.append("tool/result", mismatched, surface_op="append")
    no_flag = tool_result("t", "c1")
    del no_flag["message"]["content"][0]["isError"]
    log.append("tool/result", no_flag, surface_op="append")


def test_seed_rules():
    events = [{"type": "turn/start", "seq": 0, "time": -5, "data": {"turn": 1}}]
    log = SessionLog("s", events, clock=Clock())
    assert [e.type for e in log.events] == ["turn/start", "session/end-seed"]
    assert [e.type for e in SessionLog("s", [], clock=Clock()).events] == ["session/end-seed"]
    assert SessionLog("s", clock=Clock()).events == ()
    ended = SessionLog("s", list(log.events), clock=Clock())
    assert len(ended.events) == 2
    for bad in [
        [{"type": "turn/start", "seq": 1, "time": 0, "data": {}}],
        [{"type": "turn/start", "seq": 0, "time": 0, "data": {}, "extra": 1}],
        [{"type": "turn/start", "seq": 0, "time": 1.5, "data": {}}],
        [{"type": "turn/start", "seq": 0, "time": 0, "data": {}, "ignorable": False}],
    ]:
        with pytest.raises(EnvelopeError):
            SessionLog("s", bad, clock=Clock())


def test_seeded_events_are_events():
    log = SessionLog("s", [Event("user/message", 0, 1, user("m"), surfaceOp="append")], clock=Clock())
    assert log.derive_messages()[0]["id"] == "m"


def test_fork():
    log = new_log()
    log.append("turn/start", {"turn": 1})
    log.append("user/message", user("u"), surface_op="append")
    log.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    log.append("turn/start", {"turn": 2})
    with pytest.raises(ForkError, match="inside open turn 2"):
        log.fork("child")
    with pytest.raises(ForkError, match="inside open turn 1"):
        log.fork("child", 1)
    with pytest.raises(ForkError, match="not an existing seq"):
        log.fork("child", 9)
    child = log.fork("child", 2)
    assert child.header.parentSession == "s-1" and child.header.seedLength == 3
    assert [e.type for e in child.events][-1] == "session/end-seed"
    assert child.derive_messages() == log.derive_messages()
