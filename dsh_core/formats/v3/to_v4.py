"""dsh's v3→v4 edge (``ReleasedV3ToV4Stage``): what it does to each v3 event.

Unknown content tags become ``plugin:<tag>`` (:func:`content`); plugin
sources get their producer's kind (:func:`source`); a wrapped tool result
becomes a tool-role message (:func:`lift_tool_result`); the tags of
messages, summaries and streams are carried over (:func:`tags`); and an
event moved to another seq has its references remapped (:func:`remap`).
Each refusal is a :class:`V3MigrationRefusal`: dsh's migration cannot carry the log
(the v3 source is intact). The stateful part, which events a restart adds
and where each lands, is :class:`~dsh_core.formats.v3.fold.V3Fold`'s.
"""

from __future__ import annotations

from typing import Any

from ...errors import FormatUnsupportedError
from ...jsonvalue import MAX_SAFE_INTEGER

__all__ = ["V3MigrationRefusal", "lift_tool_result", "messages", "remap", "source", "tags"]

_RENAMED = {"compact": "compact-checkpoint", "tools-code-mode": "ptc-mode", "tools-ptc": "ptc-mode",
            "dsh-compaction-basic": "compact-basic", "@deepseek-ai/dsh-system-prompt": "runtime-context"}
_SAME_NAME = frozenset({
    "agent-instructions", "session-reference", "team-message", "goal", "skill-invocation", "skill-catalog",
    "coordinator", "subagent-report", "subagent-settled", "webhook", "agent-message", "model-selection",
    "plan-mode", "time-context", "tmux-context", "user-approval", "repeat-tool-reminder", "tool-cordis",
    "cordis-host-runner", "tool-goal", "tool-jobs", "hooks-codex", "hooks-claude-code", "schedule",
    "dsh-session-title-llm"})
_BLOCK_TYPES = frozenset({"text", "reasoning", "image", "file", "tool-call", "tool-result"})


class V3MigrationRefusal(FormatUnsupportedError):
    """dsh's migration refuses this v3 log (the source stays as it is)."""


# ------------------------------------------------------------------ the edge

def _producer(plugin: str, role: Any) -> str:
    if plugin == "@deepseek-ai/dsh-system-prompt" and role == "system":
        return "system-prompt"
    if plugin in _RENAMED:
        return _RENAMED[plugin]
    return plugin if plugin in _SAME_NAME else f"plugin:{plugin}"


def source(message: dict[str, Any], seq: int) -> dict[str, Any]:
    source = message.get("source")
    if not isinstance(source, dict):
        return message
    kind = source.get("kind")
    if type(kind) is not str or not kind:
        raise V3MigrationRefusal(f"message source at seq {seq} requires a nonempty kind")
    if kind != "plugin":
        return message
    plugin = source.get("plugin")
    if type(plugin) is not str:
        raise V3MigrationRefusal(f"plugin source at seq {seq} is not canonical: plugin requires a string")
    kind = _producer(plugin, message.get("role"))
    converted = {key: (kind if key == "kind" else value) for key, value in source.items() if key != "plugin"}
    return {**message, "source": converted}


def _content(value: Any, subject: str) -> Any:
    if not isinstance(value, list):
        raise V3MigrationRefusal(f"{subject} content must be an array")
    out = []
    for index, block in enumerate(value):
        if not isinstance(block, dict) or type(block.get("type")) is not str:
            raise V3MigrationRefusal(f"{subject}[{index}] requires content blocks with string type tags")
        out.append(block if block["type"] in _BLOCK_TYPES else {**block, "type": f"plugin:{block['type']}"})
    return out


def messages(event: dict[str, Any], change: Any) -> dict[str, Any]:
    """The event with ``change`` applied to each message it carries."""
    event_type, data = event["type"], event["data"]
    if not isinstance(data, dict):
        return event
    if event_type == "user/message":
        return {**event, "data": change(data)}
    if event_type in ("system/message", "assistant/message", "tool/result"):
        if not isinstance(data.get("message"), dict):
            raise V3MigrationRefusal(f"{event_type} requires a message")
        return {**event, "data": {**data, "message": change(data["message"])}}
    key = {"agent/inbox/spliced": "inserted", "session/title-llm-request": "messages"}.get(event_type)
    if key is None:
        return event
    if not isinstance(data.get(key), list) or not all(isinstance(item, dict) for item in data[key]):
        raise V3MigrationRefusal(f"{event_type} requires message array")
    return {**event, "data": {**data, key: [change(item) for item in data[key]]}}


def lift_tool_result(event: dict[str, Any]) -> dict[str, Any]:
    data = event["data"]
    if event["type"] != "tool/result" or not isinstance(data, dict):
        return event
    message = data.get("message")
    if not isinstance(message, dict) or message.get("role") != "user":
        return event
    source, content = message.get("source"), message.get("content")
    call_id = source.get("callId") if isinstance(source, dict) else None
    wrapper = content[0] if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict) else None
    subject = f"format v3 tool/result at seq {event['seq']}"
    if (type(message.get("id")) is not str or not message["id"] or not isinstance(source, dict)
            or source.get("kind") != "tool" or type(call_id) is not str or not call_id or wrapper is None
            or wrapper.get("type") != "tool-result" or wrapper.get("toolCallId") != call_id):
        raise V3MigrationRefusal(f"{subject} requires exactly one tool-result wrapper matching its tool source")
    if "isError" in wrapper and type(wrapper["isError"]) is not bool:
        raise V3MigrationRefusal(f"{subject} tool-result isError must be boolean")
    inner = wrapper.get("content")
    if not isinstance(inner, list):
        raise V3MigrationRefusal(f"{subject} tool-result content must be an array")
    if any(isinstance(block, dict) and block.get("type") == "tool-result" for block in inner):
        raise V3MigrationRefusal(f"{subject} contains a nested tool-result unsupported by this converter")
    lifted: dict[str, Any] = {"role": "tool", "source": source, "toolCallId": call_id, "content": inner}
    if "isError" in wrapper:
        lifted["isError"] = wrapper["isError"]
    lifted["id"] = message["id"]
    lifted.update({f"plugin:message:{key}": value for key, value in message.items()
                   if key not in ("id", "role", "source", "content")})
    lifted.update({f"plugin:result:{key}": value for key, value in wrapper.items()
                   if key not in ("type", "toolCallId", "content", "isError")})
    return {**event, "data": {**data, "message": lifted}}


def tags(event: dict[str, Any]) -> dict[str, Any]:
    subject = f"format v3 {event['type']} at seq {event['seq']}"
    event = messages(event, lambda message: {**message, "content": _content(message.get("content"), subject)})
    data = event["data"]
    if not isinstance(data, dict):
        return event
    if event["type"] == "compaction/summary":
        data = {**data, "summary": _content(data.get("summary"), f"{subject}.summary")}
        if "rawOutput" in data:
            data["rawOutput"] = _content(data["rawOutput"], f"{subject}.rawOutput")
    elif event["type"] == "tool/ptc-dispatch":
        data = {**data, "content": _content(data.get("content"), f"{subject}.content")}
    if event["type"] == "request/header" and isinstance(data.get("header"), dict):
        tools = data["header"].get("tools") or []
        if not isinstance(tools, (list, str)):  # what JavaScript's for-of cannot iterate
            raise V3MigrationRefusal(f"{subject}.header.tools is not iterable")
        for index, tool in enumerate(tools):
            if isinstance(tool, dict) and "deferLoading" in tool:
                raise V3MigrationRefusal(f"{subject}.header.tools[{index}] contains deferLoading, which is only defined in V4")
    if event["type"] in ("assistant/message", "assistant/attempt") and isinstance(data.get("stream"), list):
        stream = []
        for index, entry in enumerate(data["stream"]):
            chunk = entry.get("chunk") if isinstance(entry, dict) and entry.get("type") == "chunk" else None
            where = f"{subject}.stream[{index}]"
            if isinstance(chunk, dict) and chunk.get("type") == "block-end":
                block = _content([chunk.get("block")], f"{where}.block")[0]
                if block is not chunk["block"]:
                    entry = {**entry, "chunk": {**chunk, "block": block}}
            elif isinstance(chunk, dict) and chunk.get("type") == "block-start":
                if type(chunk.get("blockType")) is not str:
                    raise V3MigrationRefusal(f"{where} blockType must be a string")
                if chunk["blockType"] not in _BLOCK_TYPES:
                    entry = {**entry, "chunk": {**chunk, "blockType": f"plugin:{chunk['blockType']}"}}
            stream.append(entry)
        data = {**data, "stream": stream}
    return {**event, "data": data}


def remap(event: dict[str, Any], seq: int, mapping: list[int]) -> dict[str, Any]:
    """dsh's ``remapV3References``: the event at its new seq, its references
    moved; a reference or container of another shape is refused with dsh's
    words, in dsh's order."""
    if seq == event["seq"]:
        return event

    def one(value: Any) -> int:
        if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
            raise V3MigrationRefusal("V3 source event reference must be a non-negative safe integer")
        if value >= event["seq"] or value >= len(mapping):
            raise V3MigrationRefusal("V3 reference must name an earlier source event")
        return mapping[value]

    def many(value: Any) -> list[int]:
        if not isinstance(value, list):
            raise V3MigrationRefusal("V3 event references must be an array")
        return [one(item) for item in value]

    def container(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise V3MigrationRefusal("V3 event reference container must be an object")
        return value

    data, kind = event["data"], event["type"]
    if kind == "command/done":
        source = container(data)
        if "sourceEventSeq" in source:
            data = {**source, "sourceEventSeq": one(source["sourceEventSeq"])}
    elif kind in ("compaction/summary", "compaction/prune"):
        source = container(data)
        span = container(source.get("shadowedRange"))
        data = {**source, "shadowedRange": {**span, "start": one(span.get("start")), "end": one(span.get("end"))},
                "shadowedSeqs": many(source.get("shadowedSeqs"))}
    elif kind in ("session/title", "session/title-llm-request"):
        source = container(data)
        data = {**source, "messageSeqs": many(source.get("messageSeqs"))}
    elif kind == "image/offload":
        source = container(data)
        if not isinstance(source.get("targets"), list):
            raise V3MigrationRefusal("V3 image offload targets must be an array")
        data = {**source, "targets": [{**target, "seq": one(target.get("seq"))}
                                      for target in map(container, source["targets"])]}
    operation = container(event["surfaceOp"]) if event.get("surfaceOp", "append") != "append" else None
    moved = {**event, "seq": seq, "data": data}
    if "sourceEventSeqs" in event:
        moved["sourceEventSeqs"] = many(event["sourceEventSeqs"])
    if operation is not None:
        moved["surfaceOp"] = {**operation, "startSeq": one(operation.get("startSeq")),
                              "endSeq": one(operation.get("endSeq"))}
    return moved
