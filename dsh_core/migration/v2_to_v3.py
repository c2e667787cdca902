"""dsh's v2→v3 edge: the system prompt leaves the request header for the surface.

The first ``step/start`` is followed by a ``system/message`` (the surface's
protected head, empty until a prompt is known); each ``request/header``
whose ``system`` differs from the prompt in force is preceded by a
``system/message`` replacing the head, and loses ``header.system`` (empty
``tools`` and ``adapterDefaults`` go too). Generated messages get dsh's id,
``v2-to-v3-system-`` and the SHA-256 of ``["session-format-v2-to-v3",
session id, source seq, source type]``. Replace ops become
``{op, startSeq, endSeq}``; "code" names become "ptc".

Refused as dsh refuses them, in its order: a content block or message
source of a kind the edge does not classify (:data:`CONTENT_KINDS`,
:data:`SOURCE_KINDS`; the v0 inventory keeps any named kind), a message on
the surface before the first step (it cannot get a head below it), and a
migrated ``tool/result`` whose error metadata sits on a result that is not
an error.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from ..errors import FormatUnsupportedError
from ..jsonvalue import is_safe_int
from .v0_checks.messages import content_blocks
from .v0_to_v1 import refusal
from .v0_checks.values import ABSENT, js, js_keys

__all__ = ["V2ToV3"]

EDGE = "@deepseek-ai/dsh-session-format-v2-to-v3"
_SURFACE = frozenset({"system/message", "user/message", "assistant/message", "tool/result"})
#: the content block kinds and message source kinds dsh's v2→v3 edge can carry;
#: it refuses any other (the v0 inventory keeps an unknown named kind as it is).
CONTENT_KINDS = frozenset({"text", "reasoning", "image", "file", "tool-call", "tool-result"})
SOURCE_KINDS = frozenset({"user", "plugin", "model", "tool", "agent-instructions", "session-reference",
                          "team-message", "goal", "skill-invocation", "skill-catalog", "coordinator",
                          "subagent-report", "subagent-settled", "webhook", "agent-message"})
_RENAMED_TYPES = {"tool/code-dispatch-start": "tool/ptc-dispatch-start", "tool/code-dispatch": "tool/ptc-dispatch"}


class V2ToV3:
    """The edge over one log: :meth:`event` in order (its output goes to ``emit``)."""

    def __init__(self, header: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
        self.session_id = header["id"]
        self.emit = emit
        self.mapping: list[int] = []
        self.original_ids: set[str] = set()
        self.generated_ids: set[str] = set()
        self.target = 0
        self.step: tuple[Any, Any] | None = None
        self.head: int | None = None
        self.prompt = ""

    def event(self, event: dict[str, Any]) -> None:
        event_type, data = event["type"], event["data"]
        if event["seq"] != len(self.mapping):
            raise refusal("format v2 source events must be dense", EDGE, 2)
        _check_classified(event)
        self._observe_ids(event)
        if event_type == "request/header" and isinstance(data.get("header"), dict):
            header = {key: value for key, value in data["header"].items() if key != "system"}
            system = data["header"].get("system")
            prompt = system if isinstance(system, str) else ""
            if prompt != self.prompt:
                self._system(prompt, event)
            event = {**event, "data": {**data, "header": _without_empty(header)}}
        if event_type in _SURFACE and self.head is None:
            raise FormatUnsupportedError("format v2 surface before first step cannot acquire a system head without "
                                         "changing chronology")
        target = _renamed(self._remap(event))
        _check_error_metadata(target)
        self.mapping.append(self.target)
        self.target += 1
        self.emit(target)
        if event_type == "step/start":
            self.step = (data.get("turn"), data.get("step"))
            if self.head is None:
                self._system("", event)
        elif event_type in ("step/end", "turn/end"):
            self.step = None

    def _observe_ids(self, event: dict[str, Any]) -> None:
        event_type, data = event["type"], event["data"]
        messages: Any = []
        if event_type == "user/message":
            messages = [data]
        elif event_type in ("assistant/message", "tool/result"):
            messages = [data.get("message")]
        elif event_type == "agent/inbox/spliced":
            messages = data.get("inserted")
        elif event_type == "session/title-llm-request":
            messages = data.get("messages")
        for message in messages if isinstance(messages, list) else []:
            if isinstance(message, dict) and type(message.get("id")) is str:
                if message["id"] in self.generated_ids:
                    raise FormatUnsupportedError("source message id collides with a generated system message id")
                self.original_ids.add(message["id"])

    def _system(self, prompt: str, anchor: dict[str, Any]) -> None:
        if self.step is None:
            raise FormatUnsupportedError("format v2 changed request prompt outside an open step cannot retain source "
                                         "chronology")
        turn, step = self.step
        identity = json.dumps(["session-format-v2-to-v3", self.session_id, anchor["seq"], anchor["type"]],
                              separators=(",", ":"), ensure_ascii=False)
        message_id = "v2-to-v3-system-" + hashlib.sha256(identity.encode("utf-8")).hexdigest()
        if message_id in self.original_ids or message_id in self.generated_ids:
            raise FormatUnsupportedError("generated system message id collides with an existing message id")
        self.generated_ids.add(message_id)
        _coordinates({"turn": turn, "step": step})  # the v3 form of a system message (``assertSystem``)
        event: dict[str, Any] = {"type": "system/message", "seq": self.target, "time": anchor["time"], "data": {
            "turn": turn, "step": step, "message": {
                "id": message_id, "role": "system", "source": {"kind": "plugin", "plugin": "@deepseek-ai/dsh-system-prompt"},
                "content": [{"type": "text", "text": prompt}] if prompt else []}}}
        if self.head is None:
            event["surfaceOp"] = "append"
        else:
            event["surfaceOp"] = {"op": "replace", "startSeq": self.head, "endSeq": self.head}
            event["sourceEventSeqs"] = [self.head]
        self.head, self.prompt = self.target, prompt
        self.target += 1
        self.emit(event)

    def _one(self, value: Any, seq: int) -> int:
        if type(value) is not int or value < 0 or value >= seq or value >= len(self.mapping):
            raise refusal("reference must name an earlier source event", EDGE, 2)
        return self.mapping[value]

    def _remap(self, event: dict[str, Any]) -> dict[str, Any]:
        seq, data = event["seq"], event["data"]
        event_type = event["type"]
        if event_type == "command/done" and data.get("sourceEventSeq") is not None:
            data = {**data, "sourceEventSeq": self._one(data["sourceEventSeq"], seq)}
        elif event_type in ("compaction/summary", "compaction/prune"):
            span = data["shadowedRange"]
            data = {**data, "shadowedRange": {**span, "start": self._one(span["start"], seq),
                                              "end": self._one(span["end"], seq)},
                    "shadowedSeqs": [self._one(s, seq) for s in data["shadowedSeqs"]]}
        elif event_type in ("session/title", "session/title-llm-request"):
            data = {**data, "messageSeqs": [self._one(s, seq) for s in data["messageSeqs"]]}
        out = {**event, "seq": self.target, "data": data}
        if "sourceEventSeqs" in event:
            out["sourceEventSeqs"] = [self._one(s, seq) for s in event["sourceEventSeqs"]]
        op = event.get("surfaceOp")
        if op is not None and op != "append":
            out["surfaceOp"] = {"op": "replace", "startSeq": self._one(op["start"], seq),
                                "endSeq": self._one(op["end"], seq)}
        return out


def _without_empty(header: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in header.items()
            if not (key == "tools" and value == []) and not (key == "adapterDefaults" and value == {})}


def _renamed(event: dict[str, Any]) -> dict[str, Any]:
    """dsh's ``renamePtcEvent``: "code" names become "ptc"."""
    event_type, data = event["type"], event["data"]
    if event_type in _RENAMED_TYPES:
        return {**event, "type": _RENAMED_TYPES[event_type]}
    if event_type == "agent-preset/selected" and data.get("agentPreset") == "code":
        return {**event, "data": {**data, "agentPreset": "ptc"}}
    if event_type == "user/message":
        return {**event, "data": _ptc_source(data)}
    if event_type == "agent/inbox/spliced" and isinstance(data.get("inserted"), list):
        return {**event, "data": {**data, "inserted": [_ptc_source(m) for m in data["inserted"]]}}
    if event_type == "session/title-llm-request" and isinstance(data.get("messages"), list):
        return {**event, "data": {**data, "messages": [_ptc_source(m) for m in data["messages"]]}}
    return event


def _ptc_source(message: Any) -> Any:
    source = message.get("source") if isinstance(message, dict) else None
    if isinstance(source, dict) and source.get("kind") == "plugin" and source.get("plugin") == "tools-code-mode":
        return {**message, "source": {**source, "plugin": "tools-ptc"}}
    return message


# ------------------------------------------------------- v2 admission, v3 form


def _check_classified(event: dict[str, Any]) -> None:
    """What of dsh's v2 admission (``assertEvent``) a v0 log that passed its
    earlier edges can still fail: content kinds (``assertOwnedContent``), an
    assistant's turn and step, then message sources (``assertSource``)."""
    event_type, data = event["type"], event["data"]
    label = f"format v2 {event_type} at seq {event['seq']} data"
    match event_type:
        case "user/message" | "tool/code-dispatch":
            _content(data.get("content", ABSENT), f"{label}.content")
        case "assistant/message" | "tool/result" | "team/message/queued":
            message = _record(data.get("message", ABSENT), f"{label}.message")
            _content(message.get("content", ABSENT), f"{label}.message.content")
        case "agent/inbox/spliced" | "session/title-llm-request":
            field = "inserted" if event_type == "agent/inbox/spliced" else "messages"
            for index, value in enumerate(_array(data.get(field, ABSENT), f"{label}.{field}")):
                path = f"{label}.{field}[{index}]"
                _content(_record(value, path).get("content", ABSENT), f"{path}.content")
        case "compaction/summary":
            _content(data.get("summary", ABSENT), f"{label}.summary")
            if "rawOutput" in data:
                _content(data["rawOutput"], f"{label}.rawOutput")
    if event_type in ("assistant/message", "assistant/attempt"):
        for index, value in enumerate(_array(data.get("stream", ABSENT), f"{label}.stream")):
            path = f"{label}.stream[{index}]"
            if _record(value, path).get("type") != "chunk":
                continue
            chunk = _record(value.get("chunk", ABSENT), f"{path}.chunk")
            if chunk.get("type") == "block-end":
                _block(chunk.get("block", ABSENT), f"{path}.chunk.block")
            if chunk.get("type") == "block-start":
                _kind(chunk.get("blockType", ABSENT), f"{path}.chunk.blockType")
        _coordinates(data)
    match event_type:
        case "user/message":
            _source(data)
        case "assistant/message" | "tool/result":
            _source(_record(data["message"], "message"))
        case "agent/inbox/spliced" | "session/title-llm-request":
            for message in data["inserted" if event_type == "agent/inbox/spliced" else "messages"]:
                _source(message)


def _content(value: Any, label: str) -> None:
    for index, block in enumerate(_array(value, label)):
        _block(block, f"{label}[{index}]")


def _block(value: Any, label: str) -> None:
    """dsh's ``assertContentBlock``: the kind, a tool result's blocks, a file's
    attachment, then any other block as dsh's v0 checks see it in a user message."""
    block = _record(value, label)
    kind = block.get("type", ABSENT)
    _kind(kind, label)
    if kind == "tool-result":
        if not isinstance(block.get("content"), list):
            raise refusal(f'{label}.content: invalid message content kind "tool-result": content must be an array',
                          EDGE, 2)
        _content(block["content"], f"{label}.content")
    elif kind == "file":
        subject = f'{label} kind "file"'
        _fields(block, ("type", "attachment"), subject)
        attachment = _record(block["attachment"], f"{subject} attachment")
        _fields(attachment, ("attachmentId", "name", "bytes"), f"{subject} attachment")
        if type(attachment["attachmentId"]) is not str or not attachment["attachmentId"] \
                or type(attachment["name"]) is not str:
            raise refusal(f"{subject}: file attachment requires attachmentId and name", EDGE, 2)
        if not is_safe_int(attachment["bytes"]) or attachment["bytes"] < 0:
            raise refusal(f"{subject} attachment bytes must be a non-negative safe integer", EDGE, 2)
        return
    try:
        content_blocks([{**block, "content": []} if kind == "tool-result" else block], "user/message 0 content")
    except FormatUnsupportedError as error:
        reason = error.message.removeprefix(refusal("").message)  # the v0 check's own text
        raise refusal(f"{label}: invalid message content kind {js(kind)}: SessionFormatError: {reason}", EDGE,
                      2) from None


def _kind(kind: Any, label: str) -> None:
    if type(kind) is not str or kind not in CONTENT_KINDS:
        shown = "undefined" if kind is ABSENT else js(kind)
        raise FormatUnsupportedError(f"{label}: cannot safely transform unclassified message content kind {shown}")


def _source(message: dict[str, Any]) -> None:
    source = _record(message.get("source", ABSENT), "message source")
    kind = source.get("kind")
    if type(kind) is not str or kind not in SOURCE_KINDS:
        raise FormatUnsupportedError("cannot safely transform unclassified message source")
    if kind == "agent-message":
        _fields(source, ("kind", "form", "senderSessionId"), "agent-message source")
        if source["form"] != "relay" or type(source["senderSessionId"]) is not str or not source["senderSessionId"]:
            raise refusal("agent-message source requires relay form and senderSessionId", EDGE, 2)


def _coordinates(data: dict[str, Any]) -> None:
    for coordinate in ("turn", "step"):
        value = data.get(coordinate, ABSENT)
        if not is_safe_int(value) or value < 0:
            raise refusal(f"{coordinate} must be a non-negative safe integer", EDGE, 2)
        if value == 0:
            raise refusal(f"{coordinate} must be positive", EDGE, 2)


def _check_error_metadata(event: dict[str, Any]) -> None:
    """dsh's v3 form of a migrated ``tool/result`` (``assertCanonicalPayload``):
    error metadata only on a result whose one block is an error."""
    data = event["data"]
    if event["type"] != "tool/result" or "error" not in data:
        return
    subject = f"format v3 tool/result at seq {event['seq']}"
    content = _record(data.get("message", ABSENT), f"{subject} message").get("content")
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)
            and content[0].get("type") == "tool-result" and content[0].get("isError") is True):
        raise refusal(f"{subject} carries error metadata for a non-error tool result", EDGE, 2)


def _record(value: Any, label: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refusal(f"{label} must be an object", EDGE, 2)
    return value


def _array(value: Any, label: str) -> list[Any]:
    if not isinstance(value, list):
        raise refusal(f"{label}: content must be an array", EDGE, 2)
    return value


def _fields(value: dict[str, Any], required: tuple[str, ...], label: str) -> None:
    """dsh's v2→v3 ``keys``: the first missing field, then the first unexpected one."""
    missing = next((key for key in required if key not in value), None)
    unexpected = next((key for key in js_keys(value) if key not in required), None)
    if missing is not None:
        raise refusal(f"{label} lacks required field {missing}", EDGE, 2)
    if unexpected is not None:
        raise refusal(f"{label} has unexpected field {unexpected}", EDGE, 2)
