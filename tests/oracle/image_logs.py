"""v4 logs with ``image/offload`` events, and single malformed offloads of
them, for the differential tests.

:func:`image_log` is a session as dsh 0.2.1 writes one when an image-capable
route keeps refusing requests whose images exceed its budget: images in
user messages and tool results, a failed attempt before each offload, a
decision that offloads images of several messages, a tool result rewritten
and offloaded again, a compaction that shadows offloaded nodes, and an
offload of the summary. :func:`offload` is dsh's own choice of what to
offload (``offloadOldestImages``), which the random logs use too. Each of
:data:`IMAGE_MUTATIONS` breaks one rule of dsh's projection (or none: the
``valid_`` ones) by editing the log's first ``image/offload`` or appending
one, and maps a ``Log`` to the file's bytes (``None`` when the log lacks
what the mutation needs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from tests.oracle.mutations import _MODEL, _TOOL, Log, _append_frame, _Builder, _dump, _edit, _index

__all__ = ["IMAGE_MUTATIONS", "image", "image_log", "offload", "refused"]


def image(name: str, media_type: str = "image/png", named: bool = True) -> dict:
    """An image block as dsh logs one: a reference to a stored normalized attachment."""
    attachment = {"attachmentId": "sha256:" + hashlib.sha256(name.encode()).hexdigest(), "mediaType": media_type,
                  "bytes": 1000 + len(name), "width": 64, "height": 48}
    if named:
        attachment["name"] = name
    return {"type": "image", "attachment": attachment}


def offload(pictures: dict[int, list[bool]], nodes: list[int], count: int) -> list[dict] | None:
    """dsh's ``offloadOldestImages``: targets for the ``count`` oldest retained
    images of the nodes, in surface order, marking them in ``pictures``
    (seq → offloaded flag of each image of a user message or tool result)."""
    targets = []
    for seq in nodes:
        if count == 0:
            break
        flags = pictures.get(seq, [])
        indexes = [index for index, offloaded in enumerate(flags) if not offloaded][:count]
        count -= len(indexes)
        for index in indexes:
            flags[index] = True
        if indexes:
            targets.append({"seq": seq, "imageIndexes": indexes})
    return targets or None


def refused(b: _Builder, turn: int, step: int) -> None:
    """The attempt an image-capable route refused for its images."""
    b.add("assistant/attempt", {"turn": turn, "step": step, "stream": [{"type": "chunk", "time": b.time, "chunk": {
        "type": "finish", "reason": {"kind": "error", "failure": {
            "message": "request images exceed the route budget", "code": "IMAGE_OFFLOAD_REQUIRED"}}}}]})


def _tool_result(call: str, content: list[dict]) -> dict:
    return {"id": f"tool-{call}", "role": "tool", "source": {"kind": "tool", "callId": call}, "toolCallId": call,
            "content": content, "isError": False}


def image_log(session_id: str = "session-hand-images", created_at: int = 1_800_000_200_000) -> Log:
    """Three turns, eight requests (four refused for their images), four
    offloads: of a user message, of it and a tool result, of the rewritten
    result and a new message, of the summary that shadowed them all."""
    b = _Builder(session_id, created_at)
    b.frame()
    b.add("permission/preset", {"preset": "danger-full-access"})
    b.add("turn/start", {"turn": 1})
    b.add("step/start", {"turn": 1, "step": 1})
    b.add("system/message", {"turn": 1, "step": 1, "message": {"id": "system-1", "role": "system", "source": {
        "kind": "system-prompt"}, "content": [{"type": "text", "text": "You are a test agent."}]}}, surfaceOp="append")
    user = b.add("user/message", {"id": "user-1", "role": "user", "source": {"kind": "user"}, "content": [
        {"type": "text", "text": "compare these"}, image("a.png"), {"type": "text", "text": "and"},
        image("b.jpg", "image/jpeg", named=False)]}, surfaceOp="append")
    b.add("request/header", {"header": {"config": {**_MODEL, "maxTokens": 256000, "reasoningEffort": "high"},
                                        "tools": [_TOOL]}, "reason": "initial"})
    b.add("request/context", {**_MODEL, "contextWindow": 1000000})
    b.frame()
    refused(b, 1, 1)
    b.add("image/offload", {"targets": [{"seq": user, "imageIndexes": [0]}]})
    call = {"type": "tool-call", "id": "call_1", "name": "bash", "arguments": '{"command":"shot","description":"shot"}'}
    nodes = [user, b.assistant(1, 1, 1, [{"type": "text", "text": "Taking screenshots."}, call], "tool-calls")]
    call_seq = b.add("tool/call", {"turn": 1, "step": 1, "callId": "call_1", "name": "bash",
                                   "arguments": call["arguments"]})
    tool = b.add("tool/result", {"turn": 1, "step": 1, "message": _tool_result("call_1", [
        image("shot-1.webp", "image/webp"), {"type": "text", "text": "two shots"}, image("shot-2.gif", "image/gif")])},
        surfaceOp="append", sourceEventSeqs=[call_seq])
    b.add("step/end", {"turn": 1, "step": 1})
    b.frame()
    b.add("step/start", {"turn": 1, "step": 2})
    refused(b, 1, 2)
    b.add("image/offload", {"targets": [{"seq": user, "imageIndexes": [1]}, {"seq": tool, "imageIndexes": [0]}]})
    answer = b.assistant(1, 2, 2, [{"type": "text", "text": "They differ."}], "stop")
    b.add("step/end", {"turn": 1, "step": 2})
    b.add("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    b.frame()
    b.add("turn/start", {"turn": 2})
    b.add("step/start", {"turn": 2, "step": 1})
    second = b.add("user/message", {"id": "user-2", "role": "user", "source": {"kind": "user"}, "content": [
        image("c.png"), {"type": "text", "text": "and this one?"}]}, surfaceOp="append")
    rewritten = b.add("tool/result", {"turn": 1, "step": 1, "message": _tool_result("call_1", [
        {"type": "text", "text": "two shots, trimmed"}, image("shot-2.gif", "image/gif")])},
        surfaceOp={"op": "replace", "startSeq": tool, "endSeq": tool}, sourceEventSeqs=[tool])
    b.add("request/header", {"header": {"config": {**_MODEL, "maxTokens": 256000, "reasoningEffort": "high"},
                                        "tools": [_TOOL]}, "reason": "resume"})
    b.add("request/context", {**_MODEL, "contextWindow": 1000000})
    refused(b, 2, 1)
    b.add("image/offload", {"targets": [{"seq": rewritten, "imageIndexes": [0]}, {"seq": second, "imageIndexes": [0]}]})
    nodes += [rewritten, answer, second, b.assistant(2, 1, 3, [{"type": "text", "text": "A cat."}], "stop")]
    b.add("step/end", {"turn": 2, "step": 1})
    b.add("turn/end", {"turn": 2, "reason": {"kind": "completed"}})
    b.frame()
    b.add("turn/start", {"turn": 3})
    b.add("step/start", {"turn": 3, "step": 1})
    last = b.add("user/message", {"id": "user-3", "role": "user", "source": {"kind": "user"}, "content": [
        {"type": "text", "text": "once more"}, image("d.png"), image("e.png")]}, surfaceOp="append")
    summary = b.add("user/message", {"id": "summary-1", "role": "user", "source": {"kind": "user"}, "content": [
        {"type": "text", "text": "Summary so far."}, image("a.png"), image("f.png")]},
        surfaceOp={"op": "replace", "startSeq": user, "endSeq": last}, sourceEventSeqs=[*nodes, last])
    b.add("request/header", {"header": {"config": {**_MODEL, "maxTokens": 256000, "reasoningEffort": "high"},
                                        "tools": [_TOOL]}, "reason": "series", "startsSeries": True})
    b.add("request/context", {**_MODEL, "contextWindow": 1000000})
    refused(b, 3, 1)
    b.add("image/offload", {"targets": [{"seq": summary, "imageIndexes": [0]}]})
    b.assistant(3, 1, 4, [{"type": "text", "text": "Done."}], "stop")
    b.add("step/end", {"turn": 3, "step": 1})
    b.add("turn/end", {"turn": 3, "reason": {"kind": "completed"}})
    return b.log()


# -- single malformed (or still valid) offloads ------------------------------

def _first_offload(log: Log, change: Callable[[dict, list[dict]], dict]) -> bytes | None:
    """The log with its first image/offload's data replaced by ``change(data, events)``."""
    events = log.events()
    index = _index(log, lambda e: e["type"] == "image/offload")
    edited = _edit(log, index, lambda e: {**e, "data": change(e["data"], events)})
    return edited.encode() if edited else None


def _first_target(change: Callable[[dict, list[dict]], dict]) -> Callable[[Log], bytes | None]:
    return lambda log: _first_offload(log, lambda data, events: {
        "targets": [change(data["targets"][0], events), *data["targets"][1:]]})


def _seq_of(kind: str, last: bool = False) -> Callable[[dict, list[dict]], dict]:
    """The first target retargeted to the first (or last) event of ``kind``."""
    def change(target: dict, events: list[dict]) -> dict:
        seqs = [e["seq"] for e in events if e["type"] == kind]
        return {**target, "seq": seqs[-1] if last else seqs[0]}
    return change


def _appended(data: Callable[[list[dict]], object], **envelope: object) -> Callable[[Log], bytes | None]:
    """An image/offload appended at the end with ``data(events)``."""
    def mutate(log: Log) -> bytes | None:
        events = log.events()
        value = data(events)
        if value is None:
            return None
        event = {"type": "image/offload", "seq": len(events), "time": events[-1]["time"], "data": value, **envelope}
        return _append_frame(log, _dump(event))
    return mutate


def _input_content(event: dict) -> list:
    """The content of a user/message or tool/result (of v3's wrapped tool result, the wrapper's)."""
    message = event["data"] if event["type"] == "user/message" else event["data"]["message"]
    wrapped = event["type"] == "tool/result" and message.get("role") == "user"
    return message["content"][0]["content"] if wrapped else message["content"]


def _pictures(events: list[dict]) -> dict[int, list[bool]]:
    """The current user/message and tool/result nodes holding images, in surface
    order: seq → whether each image is offloaded, after the log's offloads."""
    nodes: list[int] = []
    pictures: dict[int, list[bool]] = {}
    for e in events:
        op = e.get("surfaceOp")
        if op == "append":
            nodes.append(e["seq"])
        elif isinstance(op, dict):
            start, end = nodes.index(op["startSeq"]), nodes.index(op["endSeq"])
            nodes[start:end + 1] = [e["seq"]]
        if op is not None and e["type"] in ("user/message", "tool/result"):
            flags = [block.get("offloaded") is True for block in _input_content(e)
                     if isinstance(block, dict) and block.get("type") == "image"]
            if flags:
                pictures[e["seq"]] = flags
        if e["type"] == "image/offload":
            for target in e["data"]["targets"]:
                for index in target["imageIndexes"]:
                    pictures[target["seq"]][index] = True
    return {seq: pictures[seq] for seq in nodes if seq in pictures}


Pick = Callable[[dict[int, list[bool]]], "tuple[int, list[int]] | None"]


def _one_target(pick: Pick) -> Callable[[list[dict]], dict | None]:
    """Data with the one target ``pick(pictures)`` (seq, image indexes) names, or ``None``."""
    def data(events: list[dict]) -> dict | None:
        target = pick(_pictures(events))
        return None if target is None else {"targets": [{"seq": target[0], "imageIndexes": target[1]}]}
    return data


def _remaining(pictures: dict[int, list[bool]]) -> tuple[int, list[int]] | None:
    """Every retained image of the last node that has one."""
    retained = [(seq, [i for i, done in enumerate(flags) if not done]) for seq, flags in pictures.items()]
    return next(((seq, indexes) for seq, indexes in reversed(retained) if indexes), None)


def _offloaded(pictures: dict[int, list[bool]]) -> tuple[int, list[int]] | None:
    """An offloaded image."""
    return next(((seq, [flags.index(True)]) for seq, flags in pictures.items() if True in flags), None)


def _past_the_end(pictures: dict[int, list[bool]]) -> tuple[int, list[int]] | None:
    """The image after the last of the first node."""
    return next(((seq, [len(flags)]) for seq, flags in pictures.items()), None)


def _any_image(pictures: dict[int, list[bool]]) -> tuple[int, list[int]] | None:
    return next(((seq, [0]) for seq in pictures), None)


def _logged_offloaded(log: Log, then_offload: bool) -> bytes | None:
    """The last retained image of the log written ``offloaded: true`` in its
    own event, then (``then_offload``) an offload of it appended."""
    events = log.events()
    pick = _remaining(_pictures(events))
    if pick is None:
        return None
    seq, (position, *_) = pick
    index = next(i for i, e in enumerate(events) if e["seq"] == seq)

    def mark(message: dict) -> dict:
        blocks = [block for block in message["content"] if isinstance(block, dict) and block.get("type") == "image"]
        return {**message, "content": [{**block, "offloaded": True} if block is blocks[position] else block
                                       for block in message["content"]]}

    marked = _edit(log, index, lambda e: {**e, "data": mark(e["data"]) if e["type"] == "user/message"
                                          else {**e["data"], "message": mark(e["data"]["message"])}})
    if not then_offload:
        return marked.encode()
    return _appended(lambda events: {"targets": [{"seq": seq, "imageIndexes": [position]}]})(marked)


def _null_block(log: Log) -> bytes | None:
    """A null content block in the first offloaded user message (dsh reads each block's type)."""
    events = log.events()
    targets = {t["seq"] for e in events if e["type"] == "image/offload" for t in e["data"]["targets"]}
    index = _index(log, lambda e: e["type"] == "user/message" and e["seq"] in targets)
    edited = _edit(log, index, lambda e: {**e, "data": {**e["data"], "content": [None, *e["data"]["content"]]}})
    return edited.encode() if edited else None


IMAGE_MUTATIONS: dict[str, Callable[[Log], bytes | None]] = {
    "control": Log.encode,
    "valid_offload_all_remaining": _appended(_one_target(_remaining)),
    "valid_logged_offloaded": lambda log: _logged_offloaded(log, then_offload=False),
    "data_not_object": lambda log: _first_offload(log, lambda data, events: [data]),
    "data_extra_key": lambda log: _first_offload(log, lambda data, events: {**data, "reason": "budget"}),
    "data_no_targets": lambda log: _first_offload(log, lambda data, events: {"target": data["targets"]}),
    "targets_empty": lambda log: _first_offload(log, lambda data, events: {"targets": []}),
    "targets_not_array": lambda log: _first_offload(log, lambda data, events: {"targets": data["targets"][0]}),
    "target_not_object": lambda log: _first_offload(log, lambda data, events: {"targets": [data["targets"][0]["seq"]]}),
    "target_extra_key": _first_target(lambda target, events: {**target, "count": 1}),
    "target_no_seq": _first_target(lambda target, events: {"imageIndexes": target["imageIndexes"], "at": 1}),
    "target_seq_negative": _first_target(lambda target, events: {**target, "seq": -1}),
    "target_seq_fraction": _first_target(lambda target, events: {**target, "seq": target["seq"] + 0.5}),
    "target_seq_string": _first_target(lambda target, events: {**target, "seq": str(target["seq"])}),
    "indexes_empty": _first_target(lambda target, events: {**target, "imageIndexes": []}),
    "indexes_not_array": _first_target(lambda target, events: {**target, "imageIndexes": 0}),
    "indexes_decreasing": _first_target(lambda target, events: {**target, "imageIndexes": [1, 0]}),
    "indexes_repeated": _first_target(lambda target, events: {**target, "imageIndexes": [0, 0]}),
    "index_negative": _first_target(lambda target, events: {**target, "imageIndexes": [-1]}),
    "index_fraction": _first_target(lambda target, events: {**target, "imageIndexes": [0.5]}),
    "index_missing": _first_target(lambda target, events: {**target, "imageIndexes": [0, 99]}),
    "duplicate_target": lambda log: _first_offload(log, lambda data, events: {
        "targets": [data["targets"][0], data["targets"][0]]}),
    "target_not_surface": _first_target(_seq_of("request/header")),
    "target_later_event": _first_target(lambda target, events: {**target, "seq": len(events) + 5}),
    "target_system": _first_target(_seq_of("system/message")),
    "target_assistant": _appended(lambda events: {"targets": [
        {"seq": [e["seq"] for e in events if e["type"] == "assistant/message"][-1], "imageIndexes": [0]}]}),
    "target_shadowed": _appended(lambda events: next(({"targets": [{"seq": seq, "imageIndexes": [0]}]}
                                                      for e in events if isinstance(e.get("surfaceOp"), dict)
                                                      for seq in e.get("sourceEventSeqs", [])), None)),
    "offload_again": _appended(_one_target(_offloaded)),
    "index_past_the_end": _appended(_one_target(_past_the_end)),
    "offload_logged_offloaded": lambda log: _logged_offloaded(log, then_offload=True),
    "null_block": _null_block,
    "surface_op_on_offload": _appended(_one_target(_any_image), surfaceOp="append"),
    "sources_on_offload": _appended(_one_target(_any_image), sourceEventSeqs=[0]),
}
