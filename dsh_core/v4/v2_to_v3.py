"""dsh's v2→v3 edge: the system prompt leaves the request header for the surface.

The first ``step/start`` is followed by a ``system/message`` (the surface's
protected head, empty until a prompt is known); each ``request/header``
whose ``system`` differs from the prompt in force is preceded by a
``system/message`` replacing the head, and loses ``header.system`` (empty
``tools`` and ``adapterDefaults`` go too). Generated messages get dsh's id,
``v2-to-v3-system-`` and the SHA-256 of ``["session-format-v2-to-v3",
session id, source seq, source type]``. Replace ops become
``{op, startSeq, endSeq}``; "code" names become "ptc". A message on the
surface before the first step cannot get a head below it: refused, as dsh
refuses it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from ..errors import FormatUnsupportedError
from .v0_to_v1 import refusal

__all__ = ["V2ToV3"]

EDGE = "@deepseek-ai/dsh-session-format-v2-to-v3"
_SURFACE = frozenset({"system/message", "user/message", "assistant/message", "tool/result"})
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
        target = self._remap(event)
        self.mapping.append(self.target)
        self.target += 1
        self.emit(_renamed(target))
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
