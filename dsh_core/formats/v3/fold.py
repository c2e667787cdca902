"""Reading a v3 log (dsh 0.1.5) as dsh 0.2.1 does: migrated to v4 in memory.

v3 is v4's stream model with older message shapes: a tool result is a
``role: "user"`` message holding one ``tool-result`` block, and runtime
messages name their producer as ``{kind: "plugin", plugin: NAME}``. Each
stored row is checked as v3 (:mod:`.v3_admission`), then rewritten by the v3→v4 edge (dsh's
``ReleasedV3ToV4Stage``) and handed to the v4 fold, whose refusals are
then dsh's migration refusals (unsupported-format): the v3 source is
intact, this build just cannot carry it over.

The edge, per event: an ``interrupted`` ``turn/end`` before a turn that a
restart opened while the previous one was still open (later seqs shift
and every reference is remapped); unknown ignorable types become
``plugin:<type>``; plugin sources get their producer's kind; a wrapped tool
result becomes a tool-role message; unknown content tags become
``plugin:<tag>``. Unlike v4, a bad row without a later ``turn/end`` ends the
log there (dsh's migrating reader keeps the prefix).
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from ..errors import CorruptionError, DecodeError, DshError, FormatUnsupportedError
from ..jsonvalue import MAX_SAFE_INTEGER, decode_json
from .load import V4Fold, _show
from .rows import decode_row
from .v3_admission import V3_TYPES, admit_row, check_envelope

__all__ = ["V3Fold"]

_RENAMED = {"compact": "compact-checkpoint", "tools-code-mode": "ptc-mode", "tools-ptc": "ptc-mode",
            "dsh-compaction-basic": "compact-basic", "@deepseek-ai/dsh-system-prompt": "runtime-context"}
_SAME_NAME = frozenset({
    "agent-instructions", "session-reference", "team-message", "goal", "skill-invocation", "skill-catalog",
    "coordinator", "subagent-report", "subagent-settled", "webhook", "agent-message", "model-selection",
    "plan-mode", "time-context", "tmux-context", "user-approval", "repeat-tool-reminder", "tool-cordis",
    "cordis-host-runner", "tool-goal", "tool-jobs", "hooks-codex", "hooks-claude-code", "schedule",
    "dsh-session-title-llm"})
_BLOCK_TYPES = frozenset({"text", "reasoning", "image", "file", "tool-call", "tool-result"})


class _Refusal(FormatUnsupportedError):
    """dsh's migration refuses this v3 log (the source stays as it is)."""


# ------------------------------------------------------------------ the edge

def _producer(plugin: str, role: Any) -> str:
    if plugin == "@deepseek-ai/dsh-system-prompt" and role == "system":
        return "system-prompt"
    if plugin in _RENAMED:
        return _RENAMED[plugin]
    return plugin if plugin in _SAME_NAME else f"plugin:{plugin}"


def _source(message: dict[str, Any], seq: int) -> dict[str, Any]:
    source = message.get("source")
    if not isinstance(source, dict):
        return message
    kind = source.get("kind")
    if type(kind) is not str or not kind:
        raise _Refusal(f"message source at seq {seq} requires a nonempty kind")
    if kind != "plugin":
        return message
    plugin = source.get("plugin")
    if type(plugin) is not str:
        raise _Refusal(f"plugin source at seq {seq} is not canonical: plugin requires a string")
    kind = _producer(plugin, message.get("role"))
    converted = {key: (kind if key == "kind" else value) for key, value in source.items() if key != "plugin"}
    return {**message, "source": converted}


def _content(value: Any, subject: str) -> Any:
    if not isinstance(value, list):
        raise _Refusal(f"{subject} content must be an array")
    out = []
    for index, block in enumerate(value):
        if not isinstance(block, dict) or type(block.get("type")) is not str:
            raise _Refusal(f"{subject}[{index}] requires content blocks with string type tags")
        out.append(block if block["type"] in _BLOCK_TYPES else {**block, "type": f"plugin:{block['type']}"})
    return out


def _messages(event: dict[str, Any], change: Any) -> dict[str, Any]:
    """The event with ``change`` applied to each message it carries."""
    event_type, data = event["type"], event["data"]
    if not isinstance(data, dict):
        return event
    if event_type == "user/message":
        return {**event, "data": change(data)}
    if event_type in ("system/message", "assistant/message", "tool/result"):
        if not isinstance(data.get("message"), dict):
            raise _Refusal(f"{event_type} requires a message")
        return {**event, "data": {**data, "message": change(data["message"])}}
    key = {"agent/inbox/spliced": "inserted", "session/title-llm-request": "messages"}.get(event_type)
    if key is None:
        return event
    if not isinstance(data.get(key), list) or not all(isinstance(item, dict) for item in data[key]):
        raise _Refusal(f"{event_type} requires message array")
    return {**event, "data": {**data, key: [change(item) for item in data[key]]}}


def _lift_tool_result(event: dict[str, Any]) -> dict[str, Any]:
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
        raise _Refusal(f"{subject} requires exactly one tool-result wrapper matching its tool source")
    if "isError" in wrapper and type(wrapper["isError"]) is not bool:
        raise _Refusal(f"{subject} tool-result isError must be boolean")
    inner = wrapper.get("content")
    if not isinstance(inner, list):
        raise _Refusal(f"{subject} tool-result content must be an array")
    if any(isinstance(block, dict) and block.get("type") == "tool-result" for block in inner):
        raise _Refusal(f"{subject} contains a nested tool-result unsupported by this converter")
    lifted: dict[str, Any] = {"role": "tool", "source": source, "toolCallId": call_id, "content": inner}
    if "isError" in wrapper:
        lifted["isError"] = wrapper["isError"]
    lifted["id"] = message["id"]
    lifted.update({f"plugin:message:{key}": value for key, value in message.items()
                   if key not in ("id", "role", "source", "content")})
    lifted.update({f"plugin:result:{key}": value for key, value in wrapper.items()
                   if key not in ("type", "toolCallId", "content", "isError")})
    return {**event, "data": {**data, "message": lifted}}


def _tags(event: dict[str, Any]) -> dict[str, Any]:
    subject = f"format v3 {event['type']} at seq {event['seq']}"
    event = _messages(event, lambda message: {**message, "content": _content(message.get("content"), subject)})
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
            raise _Refusal(f"{subject}.header.tools is not iterable")
        for index, tool in enumerate(tools):
            if isinstance(tool, dict) and "deferLoading" in tool:
                raise _Refusal(f"{subject}.header.tools[{index}] contains deferLoading, which is only defined in V4")
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
                    raise _Refusal(f"{where} blockType must be a string")
                if chunk["blockType"] not in _BLOCK_TYPES:
                    entry = {**entry, "chunk": {**chunk, "blockType": f"plugin:{chunk['blockType']}"}}
            stream.append(entry)
        data = {**data, "stream": stream}
    return {**event, "data": data}


def _remap(event: dict[str, Any], seq: int, mapping: list[int]) -> dict[str, Any]:
    """dsh's ``remapV3References``: the event at its new seq, its references
    moved; a reference or container of another shape is refused with dsh's
    words, in dsh's order."""
    if seq == event["seq"]:
        return event

    def one(value: Any) -> int:
        if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
            raise _Refusal("V3 source event reference must be a non-negative safe integer")
        if value >= event["seq"] or value >= len(mapping):
            raise _Refusal("V3 reference must name an earlier source event")
        return mapping[value]

    def many(value: Any) -> list[int]:
        if not isinstance(value, list):
            raise _Refusal("V3 event references must be an array")
        return [one(item) for item in value]

    def container(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _Refusal("V3 event reference container must be an object")
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
            raise _Refusal("V3 image offload targets must be an array")
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


class V3Fold:
    """The line sink of a v3 load: v3 rows, the v3→v4 edge, the v4 fold."""

    #: a bad row without a later ``turn/end`` ends the log (no corruption)
    tolerates_defects = True

    def __init__(self, where: str, observer: Any = None, folder: str | None = None, keep: bool = False) -> None:
        self.where = where
        self.v4 = V4Fold(where, observer, migrated=True, folder=folder)
        #: with ``keep``, every migrated event (what :mod:`.migrate` writes)
        self.events: list[dict[str, Any]] | None = [] if keep else None
        self.count = 0  # stored (v3) events
        self._line_no = 0
        self._issue: CorruptionError | None = None
        self._mapping: list[int] = []
        self._turn: int | None = None
        self._step_open = False
        self._next_turn_spliced = False
        self._foreign_delivery: int | None = None
        self._refusal: DshError | None = None  # a consumer's record that ended the log's migration

    @property
    def header(self) -> Any:
        return self.v4.header

    @property
    def state(self) -> Any:
        return self.v4.state

    @property
    def observer(self) -> Any:
        return self.v4.observer

    def header_value(self, parsed: Any) -> None:
        self.v4.header_value(parsed)

    def event_line(self, line: bytes) -> bool:
        self._line_no += 1
        try:
            row = decode_json(line)
        except DecodeError:
            if self._issue is None:
                self._issue = CorruptionError(f"{self.where}: corrupt session log: row {self._line_no} is not valid JSON")
            return False
        turn_end = isinstance(row, dict) and row.get("type") == "turn/end"
        if self._issue is not None:
            if turn_end:
                raise self._issue
            return False
        try:
            admit_row(row)
        except DshError as exc:
            raise type(exc)(f"{self.where}: line {self._line_no}: {exc.message}") from None
        try:
            event = self._decode(row)
        except CorruptionError as exc:
            self._issue = CorruptionError(f"{self.where}: corrupt session log: invalid committed event at line "
                                          f"{self._line_no}: {exc.message}")
            if turn_end:
                raise self._issue from None
            return False
        self._fold(event)
        return True

    def _decode(self, row: Any) -> dict[str, Any]:
        """A parsed row as the v3 event at the next seq; raises :class:`CorruptionError`."""
        event = decode_row(row, self.count)
        if type(event["seq"]) is not int or event["seq"] != self.count:
            raise CorruptionError(f"released v2 row {self.count} has seq gap (expected {self.count}, "
                                  f"got {_show(event['seq'])})")
        check_envelope(event)
        return event

    def _fold(self, event: dict[str, Any]) -> None:
        self.count += 1
        try:
            for migrated in self._migrate(event):
                self.v4.migrated_event(migrated)
                if self.events is not None:
                    self.events.append(migrated)
        except _Refusal as exc:
            raise _Refusal(f"{self.where}: @deepseek-ai/dsh-session-format-v3-to-v4 refuses this format v3 "
                           f"Session: {exc.message}") from None

    def apply(self, line: bytes) -> None:
        """Fold one record value at the next seq, as a consumer does (see
        :meth:`V4Fold.apply <dsh_core.v4.load.V4Fold.apply>`)."""
        try:
            row = decode_json(line)
            admit_row(row)
        except DecodeError as exc:
            raise DecodeError(f"{self.where}: seq {self.count}: {exc.message}") from None
        except DshError as exc:
            self._refusal = self._refusal or type(exc)(f"{self.where}: seq {self.count}: {exc.message}")
            return
        try:
            event = self._decode(row)
        except CorruptionError as exc:
            raise DecodeError(f"{self.where}: seq {self.count}: invalid committed event: {exc.message}") from None
        try:
            self._fold(event)
        except _Refusal as exc:
            self._refusal = self._refusal or exc

    @property
    def error(self) -> DshError | None:
        """The refusal of the log so far (see :attr:`V4Fold.error <dsh_core.v4.load.V4Fold.error>`)."""
        return self._refusal or self.v4.error

    @property
    def idle(self) -> bool:
        return self.v4.idle

    def _migrate(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        data = event["data"]
        restarted = (event["type"] == "turn/start" and self._turn is not None and not self._step_open
                     and self._next_turn_spliced and isinstance(data, dict) and data.get("turn") == self._turn + 1)
        if restarted:
            out.append({"type": "turn/end", "seq": self.v4.count, "time": event["time"],
                        "data": {"turn": self._turn, "reason": {"kind": "interrupted"}}})
        self._next_turn_spliced = (event["type"] == "agent/inbox/spliced" and isinstance(data, dict)
                                   and data.get("target") == "next-turn" and isinstance(data.get("inserted"), list)
                                   and len(data["inserted"]) > 0)
        if event["type"] == "turn/start" and isinstance(data, dict) and type(data.get("turn")) is int:
            self._turn = data["turn"]
        elif event["type"] == "turn/end":
            self._turn = None
        elif event["type"] in ("step/start", "step/end"):
            self._step_open = event["type"] == "step/start"
        target = self.v4.count + len(out)
        if event["type"] == "session-log-deepseek/delivery-accepted" and isinstance(data, dict):
            if data.get("sessionFormatVersion") == 4:
                raise _Refusal("format v3 delivery marker claims target format v4")
            version = data.get("sessionFormatVersion", 0)
            if version == 3 and data.get("sessionId") != self.header.id and self._foreign_delivery is None:
                self._foreign_delivery = event["seq"]
        if event.get("ignorable") is True and event["type"] not in V3_TYPES:
            self._mapping.append(target)
            out.append({**event, "seq": target, "type": f"plugin:{event['type']}"})
            return out
        if event["type"] not in V3_TYPES:
            raise _Refusal(f"format v3 contains unknown event type {_show(event['type'])} at seq {event['seq']}")
        moved = _remap(event, target, self._mapping)
        self._mapping.append(target)
        moved = _messages(moved, lambda message: _source(message, event["seq"]))
        out.append(_tags(_lift_tool_result(moved)))
        return out

    def finish(self) -> list[dict[str, Any]]:
        header = self.header
        cut = self.v4.inherited
        if self._foreign_delivery is not None and (header.parentSession is UNSET or cut is None
                                                   or self._foreign_delivery >= cut):
            raise _Refusal(f"{self.where}: @deepseek-ai/dsh-session-format-v3-to-v4 refuses this format v3 Session: "
                           "current-generation delivery marker names the wrong Session")
        return self.v4.finish()

