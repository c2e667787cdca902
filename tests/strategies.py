"""Hypothesis strategies: random valid dsh logs and random mutations of them.

Valid logs are built through :class:`SessionLog`, the way an agent loop
would write them: turns of steps, streamed chunks (text, reasoning and
tool-call deltas that pack into rows), parallel tool calls and results,
request headers and contexts, compaction replaces, tool-result trims,
plugin events and ignorable unknown types.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from dsh_core.jsonvalue import thaw
from dsh_core.session import SessionLog

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
SMALL = st.integers(min_value=0, max_value=3)


class _Clock:
    def __init__(self, start: int, gaps: list[int]) -> None:
        self.now, self.gaps, self.i = start, gaps, 0

    def __call__(self) -> int:
        self.now += self.gaps[self.i % len(self.gaps)]
        self.i += 1
        return self.now


def _message(mid: str, role: str, content: list, source: dict) -> dict:
    return {"id": mid, "role": role, "content": content, "source": source}


@st.composite
def session_logs(draw: Any, min_turns: int = 0, max_turns: int = 3) -> list[dict[str, Any]]:
    """A random valid log as a list of event dicts (seq == index)."""
    gaps = draw(st.lists(st.integers(min_value=-3, max_value=40), min_size=1, max_size=5))
    log = SessionLog("prop-session", clock=_Clock(draw(st.integers(0, 2**40)), gaps))
    ids = iter(range(10**6))

    def mid() -> str:
        return f"m{next(ids)}"

    for turn in range(1, draw(st.integers(min_turns, max_turns)) + 1):
        if draw(st.booleans()):
            log.append("agent/inbox/spliced", {"target": "next-turn", "start": 0, "inserted": []})
        log.append("turn/start", {"turn": turn})
        for step in range(1, draw(st.integers(0, 3)) + 1):
            log.append("step/start", {"turn": turn, "step": step})
            for _ in range(draw(SMALL)):
                log.append("user/message", _message(mid(), "user", [{"type": "text", "text": draw(TEXT)}],
                                                    {"kind": draw(st.sampled_from(["user", "plugin"]))}),
                           surface_op="append")
            if draw(st.booleans()):
                config = {"provider": "deepseek", "model": draw(st.sampled_from(["chat", "reasoner"]))}
                if draw(st.booleans()):
                    config["maxTokens"] = draw(st.integers(1, 9000))
                header: dict[str, Any] = {"config": config}
                if draw(st.booleans()):
                    header["system"] = draw(TEXT)
                if draw(st.booleans()):
                    header["tools"] = [{"name": "ls", "description": "list", "parameters": {"type": "object"}}]
                log.append("request/header", {"header": header, "reason": draw(st.sampled_from(["initial", "change"]))})
            if draw(st.booleans()):
                log.append("request/context", {"provider": "deepseek", "model": "chat"})
            chunk_seqs = []
            blocks: list[dict[str, Any]] = []
            calls = []
            for index in range(draw(st.integers(0, 3))):
                kind = draw(st.sampled_from(["text", "reasoning", "tool"]))
                pieces = draw(st.lists(TEXT, min_size=0, max_size=6))
                if kind == "tool":
                    call_id = f"call_{turn}_{step}_{index}"
                    calls.append(call_id)
                    for k, piece in enumerate(pieces):
                        chunk = {"type": "tool-call-delta", "index": index, "id": call_id}
                        if k == 0:
                            chunk["name"] = "ls"
                        chunk["argumentsDelta"] = piece
                        chunk_seqs.append(log.append("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk}).seq)
                    blocks.append({"type": "tool-call", "id": call_id, "name": "ls", "arguments": "".join(pieces)})
                else:
                    for piece in pieces:
                        chunk = {"type": f"{kind}-delta", "index": index, "text": piece}
                        chunk_seqs.append(log.append("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk}).seq)
                    blocks.append({"type": kind, "text": "".join(pieces)})
            chunk_seqs.append(log.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {
                "type": "finish", "reason": {"kind": "tool-calls" if calls else "stop"}}}).seq)
            data: dict[str, Any] = {"turn": turn, "step": step, "message": _message(
                mid(), "assistant", blocks, {"kind": "model", "provider": "deepseek", "model": "chat"})}
            if draw(st.booleans()):
                data["usage"] = {"inputTokens": draw(st.integers(0, 999)), "outputTokens": draw(st.integers(0, 99))}
            log.append("assistant/message", data, surface_op="append", source_event_seqs=chunk_seqs)
            for call_id in draw(st.permutations(calls)):
                call = log.append("tool/call", {"turn": turn, "step": step, "callId": call_id, "name": "ls", "arguments": "{}"})
                result = {"turn": turn, "step": step, "message": _message(
                    mid(), "user", [{"type": "tool-result", "toolCallId": call_id,
                                     "content": [{"type": "text", "text": draw(TEXT)}], "isError": draw(st.booleans())}],
                    {"kind": "tool", "callId": call_id})}
                stored = log.append("tool/result", result, surface_op="append", source_event_seqs=[call.seq])
                if draw(st.integers(0, 4)) == 0:  # trim the result's content
                    trimmed = copy.deepcopy(result)
                    trimmed["message"]["content"][0]["content"] = [{"type": "text", "text": "[trimmed]"}]
                    log.append("tool/result", trimmed, surface_op={"op": "replace", "start": stored.seq, "end": stored.seq},
                               source_event_seqs=[stored.seq])
            if draw(st.integers(0, 5)) == 0:
                log.append("x-ext/marker", {"note": draw(TEXT)}, ignorable=True)
            log.append("step/end", {"turn": turn, "step": step})
        nodes = list(log.surface_nodes)
        if len(nodes) >= 2 and draw(st.integers(0, 3)) == 0:  # compaction
            start = draw(st.integers(0, len(nodes) - 2))
            end = draw(st.integers(start, len(nodes) - 1))
            summary = log.append("compaction/summary", {"summary": draw(TEXT)})
            log.append("user/message", _message(mid(), "user", [{"type": "text", "text": "summary"}],
                                                {"kind": "plugin", "plugin": "compaction"}),
                       surface_op={"op": "replace", "start": nodes[start], "end": nodes[end]},
                       source_event_seqs=nodes[start:end + 1] + [summary.seq])
        reason = draw(st.sampled_from([{"kind": "completed"}, {"kind": "max-tokens"},
                                       {"kind": "aborted", "reason": {"kind": "user"}}]))
        log.append("turn/end", {"turn": turn, "reason": reason})
    return [thaw(event.to_dict()) for event in log.events]


def _mutations(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Every applicable mutation of a log, as (name, function)."""
    out: list[tuple[str, Any]] = []
    for i, event in enumerate(events):
        out.append((f"extra-key@{i}", lambda e, i=i: e[i].update(extra=1)))
        out.append((f"time-fraction@{i}", lambda e, i=i: e[i].update(time=e[i]["time"] + 0.5)))
        out.append((f"ignorable-false@{i}", lambda e, i=i: e[i].update(ignorable=False)))
        out.append((f"seq-shift@{i}", lambda e, i=i: e[i].update(seq=e[i]["seq"] + 1)))
        if "surfaceOp" in event:
            out.append((f"surfaceop-missing@{i}", lambda e, i=i: e[i].pop("surfaceOp")))
            out.append((f"surfaceop-bad@{i}", lambda e, i=i: e[i].update(surfaceOp="prepend")))
            out.append((f"sources-later@{i}", lambda e, i=i: e[i].update(sourceEventSeqs=[e[i]["seq"]])))
            out.append((f"sources-empty@{i}", lambda e, i=i: e[i].update(sourceEventSeqs=[])))
            if isinstance(event["surfaceOp"], dict):
                out.append((f"replace-sources-missing@{i}", lambda e, i=i: e[i].pop("sourceEventSeqs")))
                out.append((f"replace-start-zero@{i}", lambda e, i=i: e[i]["surfaceOp"].update(start=0)))
                out.append((f"replace-extra@{i}", lambda e, i=i: e[i]["surfaceOp"].update(x=1)))
            out.append((f"message-id-empty@{i}", lambda e, i=i: _message_of(e[i]).update(id="")))
        else:
            out.append((f"surfaceop-on-non-surface@{i}", lambda e, i=i: e[i].update(surfaceOp="append")))
        if event["type"] == "request/header":
            out.append((f"header-no-model@{i}", lambda e, i=i: e[i]["data"]["header"]["config"].pop("model")))
            out.append((f"header-fallback@{i}", lambda e, i=i: e[i]["data"].update(reason="fallback")))
    return out


def _message_of(event: dict[str, Any]) -> dict[str, Any]:
    return event["data"] if event["type"] == "user/message" else event["data"]["message"]


@st.composite
def mutated_logs(draw: Any) -> tuple[str, list[dict[str, Any]]]:
    """A valid log with one random mutation applied: (mutation name, events)."""
    events = draw(session_logs(min_turns=1))
    by_kind: dict[str, list[tuple[str, Any]]] = {}
    for name, mutate in _mutations(events):
        by_kind.setdefault(name.split("@")[0], []).append((name, mutate))
    kind = draw(st.sampled_from(sorted(by_kind)))  # each kind equally likely, then a place
    name, mutate = draw(st.sampled_from(by_kind[kind]))
    mutated = copy.deepcopy(events)
    mutate(mutated)
    return name, mutated
