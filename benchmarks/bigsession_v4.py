"""Generates one long v4 session (dsh 0.2.x) of realistic mix, for memory benchmarks.

A long-running agent: turns of two steps, the first streaming reasoning and
text and calling bash (its result a few KB of output), the second
answering. Every 25 turns a summary ``user/message`` replaces all but the
system prompt and the last two surface nodes, as a real session compacts
long before its log reaches hundreds of megabytes. Written as plain JSONL
(``session.v4.jsonl``) in a folder named for the session; deterministic and
valid for dsh_core's v4 reader.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from dsh_core.jsonvalue import encode_json

SESSION_ID = "session-long-v4"
MODEL = {"provider": "deepseek-official", "model": "deepseek-v4-flash"}
TOOL = {"name": "bash", "description": "Execute a bash command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}
WORDS = ("the", " agent", " reads", " files", " and", " runs", " tests", ";", " then", " writes", " a", " patch", ".")


def write_long_v4_session(root: Path, target_bytes: int, seed: int = 7) -> dict[str, Any]:
    """Write ``root/<id>/session.v4.jsonl`` of about ``target_bytes``; returns its path and counts."""
    rng = random.Random(seed)
    folder = root / SESSION_ID
    folder.mkdir(parents=True)
    path = folder / "session.v4.jsonl"
    state = {"seq": 0, "time": 1_767_225_600_000, "bytes": 0}
    nodes: list[int] = []
    with open(path, "wb") as out:
        def put(record: dict[str, Any]) -> None:
            line = encode_json(record) + b"\n"
            out.write(line)
            state["bytes"] += len(line)

        def event(kind: str, data: Any, **extra: Any) -> int:
            state["time"] += 7
            put({"type": kind, "seq": state["seq"], "time": state["time"], "data": data, **extra})
            state["seq"] += 1
            return state["seq"] - 1

        def text(words: int) -> str:
            return "".join(rng.choice(WORDS) for _ in range(words))

        put({"type": "session", "version": 4, "id": SESSION_ID, "createdAt": state["time"], "cwd": "/work",
             "isSeeded": False, "delegationDepth": 0})
        turn = 0
        while state["bytes"] < target_bytes:
            turn += 1
            event("turn/start", {"turn": turn})
            if turn % 25 == 0 and len(nodes) > 4:
                shadowed = nodes[1:-2]
                summary = event("user/message", {"id": f"summary-{turn}", "role": "user", "source": {"kind": "user"},
                                                 "content": [{"type": "text", "text": text(200)}]},
                                surfaceOp={"op": "replace", "startSeq": shadowed[0], "endSeq": shadowed[-1]},
                                sourceEventSeqs=shadowed)
                nodes[1:-2] = [summary]
            event("step/start", {"turn": turn, "step": 1})
            if turn == 1:
                nodes.append(event("system/message", {"turn": 1, "step": 1, "message": {
                    "id": "system", "role": "system", "source": {"kind": "system-prompt"},
                    "content": [{"type": "text", "text": text(300)}]}}, surfaceOp="append"))
            nodes.append(event("user/message", {"id": f"user-{turn}", "role": "user", "source": {"kind": "user"},
                                                "content": [{"type": "text", "text": text(30)}]}, surfaceOp="append"))
            event("request/header", {"header": {"config": {**MODEL, "maxTokens": 256000, "reasoningEffort": "high"},
                                                "tools": [TOOL]}, "reason": "initial" if turn == 1 else "resume"})
            call = {"type": "tool-call", "id": f"call-{turn}", "name": "bash", "arguments": '{"command":"make test"}'}
            for step, blocks in ((1, [{"type": "reasoning", "text": text(150)}, {"type": "text", "text": text(60)}, call]),
                                 (2, [{"type": "text", "text": text(80)}])):
                if step == 2:
                    event("step/start", {"turn": turn, "step": 2})
                pieces = [block["text"][i:i + 8] for block in blocks if "text" in block
                          for i in range(0, len(block["text"]), 8)]
                stream = [{"type": "text-chunks", "time0": state["time"], "index": 0, "dt": [1] * (len(pieces) - 1),
                           "texts": pieces},
                          {"type": "chunk", "time": state["time"], "chunk": {"type": "finish", "reason": {"kind": "stop"}}}]
                nodes.append(event("assistant/message", {"turn": turn, "step": step, "message": {
                    "id": f"assistant-{turn}-{step}", "role": "assistant", "content": blocks,
                    "source": {"kind": "model", **MODEL}}, "stream": stream}, surfaceOp="append"))
                if step == 1:
                    call_seq = event("tool/call", {"turn": turn, "step": 1, "callId": call["id"], "name": "bash",
                                                   "arguments": call["arguments"]})
                    nodes.append(event("tool/result", {"turn": turn, "step": 1, "message": {
                        "id": f"tool-{turn}", "role": "tool", "source": {"kind": "tool", "callId": call["id"]},
                        "toolCallId": call["id"], "content": [{"type": "text", "text": text(1500)}]}},
                        surfaceOp="append", sourceEventSeqs=[call_seq]))
                event("step/end", {"turn": turn, "step": step})
            event("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return {"path": path, "bytes": state["bytes"], "events": state["seq"], "turns": turn}
