"""Random v4 logs in dsh 0.2.1's shapes, for the differential tests.

Each log is a valid session as the runtime writes one: turns of steps,
failed attempts before an answer, tool calls settled by their results,
titles, delivery markers, ignorable events of a newer harness, a replace of
the conversation so far, frames of random size, and sometimes a crashed
tail (a turn left open). With ``images``, user messages and tool results
hold images and a route refusing a request for them is answered as dsh
answers it: an ``image/offload`` of the oldest retained ones, then a retry.
Mutations of them (``tests/oracle/mutations.py``, ``image_logs.py``) make
the invalid ones.
"""

from __future__ import annotations

import random

from tests.oracle.image_logs import image, offload, refused
from tests.oracle.mutations import _MODEL, _TOOL, Log, _Builder

__all__ = ["random_log"]


class _Images:
    """The images of the log's current nodes (seq → offloaded flags), or none at all."""

    def __init__(self, rng: random.Random, enabled: bool) -> None:
        self.rng, self.enabled = rng, enabled
        self.pictures: dict[int, list[bool]] = {}
        self.count = 0

    def blocks(self) -> list[dict]:
        if not self.enabled:
            return []
        self.count += 1
        return [image(f"image-{self.count}-{k}.png", named=self.rng.random() < 0.7)
                for k in range(self.rng.choice([0, 1, 1, 2, 3]))]

    def add(self, seq: int, content: list[dict]) -> int:
        flags = [False for block in content if block["type"] == "image"]
        if flags:
            self.pictures[seq] = flags
        return seq

    def offload(self, b: _Builder, nodes: list[int], turn: int, step: int) -> None:
        """Sometimes a request refused for its images, and dsh's offload."""
        retained = any(not done for flags in self.pictures.values() for done in flags)
        if not retained or self.rng.random() >= 0.4:
            return
        refused(b, turn, step)
        b.add("image/offload", {"targets": offload(self.pictures, nodes, self.rng.randint(1, 3))})


def _user(b: _Builder, rng: random.Random, number: int, images: _Images) -> int:
    text = rng.choice(["hello", "run it", "what now?", "ünïcødé ✓", ""])
    content = [{"type": "text", "text": text}, *images.blocks()]
    return images.add(b.add("user/message", {"id": f"user-{number}", "role": "user", "content": content,
                                             "source": {"kind": "user"}}, surfaceOp="append"), content)


def random_log(rng: random.Random, session_id: str, images: bool = False) -> Log:
    b = _Builder(session_id, 1_800_000_000_000 + rng.randrange(10**6))
    album = _Images(rng, images)
    b.frame()
    b.add("permission/preset", {"preset": "danger-full-access"})
    users: list[int] = []
    nodes: list[int] = []
    answers = calls = 0
    for turn in range(1, rng.randint(1, 3) + 1):
        b.add("turn/start", {"turn": turn})
        for step in range(1, rng.randint(1, 3) + 1):
            b.add("step/start", {"turn": turn, "step": step})
            if turn == 1 and step == 1:
                nodes.append(b.add("system/message", {"turn": 1, "step": 1, "message": {
                    "id": "system-1", "role": "system", "source": {"kind": "system-prompt"},
                    "content": [{"type": "text", "text": "You are a test agent."}]}}, surfaceOp="append"))
            if step == 1:
                users.append(_user(b, rng, len(users) + 1, album))
                nodes.append(users[-1])
                if turn > 1 and rng.random() < 0.3 and len(nodes) > 2:  # the conversation so far, replaced
                    shadowed = nodes[1:]
                    for seq in shadowed:
                        album.pictures.pop(seq, None)
                    content = [{"type": "text", "text": "summary"}, *album.blocks()]
                    summary = b.add("user/message", {
                        "id": f"summary-{turn}", "role": "user", "content": content,
                        "source": {"kind": "user"}}, surfaceOp={"op": "replace", "startSeq": shadowed[0],
                                                                "endSeq": shadowed[-1]}, sourceEventSeqs=shadowed)
                    nodes[1:] = [album.add(summary, content)]
                b.add("request/header", {"header": {"config": {**_MODEL, "maxTokens": 256000, "reasoningEffort": "high"},
                                                    "tools": [_TOOL]}, "reason": "initial" if turn == 1 else "resume"})
                b.add("request/context", {**_MODEL, "contextWindow": 1000000})
            if rng.random() < 0.3:
                b.add("assistant/attempt", {"turn": turn, "step": step, "stream": [{"type": "chunk", "time": b.time, "chunk": {
                    "type": "finish", "reason": {"kind": "error", "failure": {"message": "boom", "code": "SERVER"}}}}]})
            album.offload(b, nodes, turn, step)
            if rng.random() < 0.2:
                b.frame()
            if rng.random() < 0.15:
                b.add("future/thing", {"n": rng.randrange(9)}, ignorable=True)
            if rng.random() < 0.2 and users:
                b.add("session/title", {"title": "t", "messageSeqs": [rng.choice(users)], "source": {"kind": "fallback"}})
            last = step == 3 or rng.random() < 0.4
            tool_calls = [] if last else [
                {"type": "tool-call", "id": f"call_{calls + k}", "name": "bash",
                 "arguments": '{"command":"echo %d","description":"echo"}' % k} for k in range(rng.randint(1, 2))]
            calls += len(tool_calls)
            answers += 1
            nodes.append(b.assistant(turn, step, answers, [{"type": "text", "text": rng.choice(["ok", "", "done"])}, *tool_calls],
                                     "tool-calls" if tool_calls else "stop"))
            if rng.random() < 0.2:
                b.add("session-log-deepseek/delivery-accepted",
                      {"sessionId": session_id, "sessionFormatVersion": 4, "throughSeq": rng.randrange(b.seq)})
            for call in tool_calls:
                call_seq = b.add("tool/call", {"turn": turn, "step": step, "callId": call["id"], "name": "bash",
                                               "arguments": call["arguments"]})
                content = [{"type": "text", "text": "0"}, *album.blocks()]
                nodes.append(album.add(b.add("tool/result", {"turn": turn, "step": step, "message": {
                    "id": f"tool-{call['id']}", "role": "tool", "source": {"kind": "tool", "callId": call["id"]},
                    "toolCallId": call["id"], "content": content, "isError": False}},
                    surfaceOp="append", sourceEventSeqs=[call_seq]), content))
            if rng.random() < 0.05:
                return b.log()  # a crash: the turn stays open
            b.add("step/end", {"turn": turn, "step": step})
            if rng.random() < 0.3:
                b.frame()
            if last:
                break
        b.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        b.frame()
    return b.log()
