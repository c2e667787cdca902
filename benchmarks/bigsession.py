"""Generates one long dsh session file of realistic mix, for memory benchmarks.

A long-running agent: turns of a few steps, each streaming reasoning, text
and tool-call deltas (stored as packed rows of ≤ 40 members, as dsh's 200 ms
batches pack them), then the assembled message, tool calls and results.
Every 25 turns it compacts: a summary ``user/message`` replaces all but the
last few surface nodes, as a real session must long before its log reaches
hundreds of megabytes. Deterministic; the file is valid for dsh_core.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from dsh_core.jsonvalue import encode_json
from dsh_core.session_header import SessionHeader

WORDS = ("the", " agent", " reads", " files", " and", " runs", " tests", ";", " then", " it", " writes",
         " a", " patch", ".", "\n", " ok", " -", " src/", "main", ".py")
ROW = 40


def write_big_session(path: Path, target_bytes: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    out = open(path, "wb")
    written = 0
    seq = 0
    time = 1_767_225_600_000
    nodes: list[int] = []
    chunk_events = 0

    def put(record: dict[str, Any]) -> None:
        nonlocal written
        line = encode_json(record) + b"\n"
        out.write(line)
        written += len(line)

    def event(event_type: str, data: Any, **extra: Any) -> int:
        nonlocal seq, time
        time += rng.randint(0, 30)
        put({"type": event_type, "seq": seq, "time": time, "data": data, **extra})
        seq += 1
        return seq - 1

    def stream(turn: int, step: int, index: int, kind: str, pieces: list[str], call: str | None = None) -> list[int]:
        nonlocal seq, time, chunk_events
        seqs: list[int] = []
        for start in range(0, len(pieces), ROW):
            members = pieces[start:start + ROW]
            dt = [rng.randint(0, 40) for _ in members[1:]]
            data: dict[str, Any] = {"turn": turn, "step": step, "index": index, "dt": dt}
            if call is None:
                data["texts"] = members
            else:
                data["id"] = call
                data["args"] = members
            put({"type": kind, "seq0": seq, "time0": time, "data": data})
            seqs.extend(range(seq, seq + len(members)))
            seq += len(members)
            time += sum(dt) + rng.randint(0, 30)
            chunk_events += len(members)
        return seqs

    session_id = "big-session-0001"
    put({"type": "session", **SessionHeader(id=session_id, createdAt=time, cwd="/home/dev/project",
                                              delegationDepth=0).to_dict()})
    tools = [{"name": "bash", "description": "Run a command.", "parameters": {"type": "object"}}]
    turn = 0
    message_id = 0
    while written < target_bytes:
        turn += 1
        event("turn/start", {"turn": turn})
        for step in range(1, rng.randint(1, 4) + 1):
            event("step/start", {"turn": turn, "step": step})
            if step == 1:
                message_id += 1
                nodes.append(event("user/message", {"id": f"u{message_id}", "role": "user", "content": [
                    {"type": "text", "text": "Please continue with the next task " * 3}], "source": {"kind": "user"}},
                    surfaceOp="append"))
                if turn % 10 == 1:
                    event("request/header", {"header": {"config": {"provider": "deepseek", "model": "deepseek-chat"},
                                                        "system": "You are a coding agent.", "tools": tools},
                                             "reason": "initial" if turn == 1 else "resume"})
            sources = [event("assistant/chunk", {"turn": turn, "step": step, "chunk": {
                "type": "block-start", "index": 0, "blockType": "reasoning"}})]
            chunk_events += 1
            reasoning = [rng.choice(WORDS) for _ in range(rng.randint(60, 400))]
            sources += stream(turn, step, 0, "reasoning-chunks", reasoning)
            text = [rng.choice(WORDS) for _ in range(rng.randint(40, 300))]
            sources += stream(turn, step, 1, "text-chunks", text)
            call = f"call_{turn}_{step}" if rng.random() < 0.7 else None
            blocks: list[dict[str, Any]] = [{"type": "reasoning", "text": "".join(reasoning)},
                                            {"type": "text", "text": "".join(text)}]
            if call:
                args = ['{"command": "', "pytest", " -q", " tests/", "unit", '"}']
                sources += stream(turn, step, 2, "tool-call-chunks", args, call=call)
                blocks.append({"type": "tool-call", "id": call, "name": "bash", "arguments": "".join(args)})
            for chunk in ({"type": "usage", "usage": {"inputTokens": 900, "outputTokens": 300}},
                          {"type": "finish", "reason": {"kind": "tool-calls" if call else "stop"}}):
                sources.append(event("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk}))
                chunk_events += 1
            message_id += 1
            nodes.append(event("assistant/message", {"turn": turn, "step": step, "message": {
                "id": f"a{message_id}", "role": "assistant", "content": blocks,
                "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}},
                "usage": {"inputTokens": 900, "outputTokens": 300}}, sourceEventSeqs=sources, surfaceOp="append"))
            if call:
                call_seq = event("tool/call", {"turn": turn, "step": step, "callId": call, "name": "bash",
                                               "arguments": "{}"})
                message_id += 1
                output = "".join(rng.choice(WORDS) for _ in range(rng.randint(50, 600)))
                nodes.append(event("tool/result", {"turn": turn, "step": step, "message": {
                    "id": f"t{message_id}", "role": "user", "source": {"kind": "tool", "callId": call},
                    "content": [{"type": "tool-result", "toolCallId": call, "content": [{"type": "text", "text": output}],
                                 "isError": False}]}}, sourceEventSeqs=[call_seq], surfaceOp="append"))
            event("step/end", {"turn": turn, "step": step})
        if turn % 25 == 0 and len(nodes) > 6:
            shadowed = nodes[:-4]
            summary = event("compaction/summary", {"summary": "earlier work", "shadowedSeqs": shadowed})
            message_id += 1
            replacing = event("user/message", {"id": f"s{message_id}", "role": "user", "content": [
                {"type": "text", "text": "Summary of the work so far."}],
                "source": {"kind": "plugin", "plugin": "compaction"}},
                sourceEventSeqs=shadowed + [summary], surfaceOp={"op": "replace", "start": shadowed[0], "end": shadowed[-1]})
            nodes = [replacing] + nodes[-4:]
        event("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    out.close()
    return {"bytes": written, "events": seq, "chunk_events": chunk_events, "turns": turn}
