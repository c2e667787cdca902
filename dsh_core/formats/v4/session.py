"""The v4 session fold: event adoption, the surface, derived messages and
the request header (dsh 0.2.1's ``adoptSessionEvent`` and ``foldSurface``).

Adoption checks each event on its own (payload fields, surface metadata,
message shape): a failure is a corrupt stored log, as dsh's store reports it.
The surface fold then places each surface event (append, or a replace of a
current range ``{op: "replace", startSeq, endSeq}``) and refuses what dsh's
fold refuses (invalid-log). Derivation: ``user/message`` → its data;
``system/message``, ``developer/message``, ``assistant/message`` → their
message unless its content is empty; ``tool/result`` → its tool-role message,
each as the ``image/offload`` events so far project it (:mod:`.images`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from ...errors import CorruptionError, SurfaceError
from ...jsonvalue import MAX_SAFE_INTEGER, FrozenDict, freeze, json_equal
from .images import project_offload
from .lookback import ToolsBySeq
from .vocabulary import KNOWN_TYPES, SURFACE_TYPES

__all__ = ["V4State", "adopt_event", "canonical_header", "derive_message"]

_ROLES = {"system/message": "system", "developer/message": "developer", "user/message": "user",
          "assistant/message": "assistant", "tool/result": "tool"}


def _seq(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


class AdoptionError(CorruptionError):
    """An event dsh's store refuses to adopt (``failed validation``)."""


def _check_data(event: dict[str, Any], subject: str) -> None:
    """dsh's ``validateSessionEventData``."""
    event_type, data = event["type"], event["data"]
    if event_type in SURFACE_TYPES and isinstance(data, dict):
        message = data if event_type == "user/message" else data.get("message")
        if isinstance(message, dict):
            if (event_type == "developer/message") != (message.get("role") == "developer"):
                raise AdoptionError(f"{subject} developer/message and developer role must occur together")
            content = message.get("content")
            if message.get("role") != "developer" and isinstance(content, list) and any(
                    isinstance(block, dict) and block.get("type") in ("tool-addition", "tool-removal") for block in content):
                raise AdoptionError(f"{subject} tool-change blocks require developer role")
            if event_type == "developer/message" and isinstance(content, list):
                additions = False
                for block in content:
                    if not isinstance(block, dict) or block.get("type") not in ("tool-addition", "tool-removal"):
                        continue
                    if type(block.get("toolName")) is not str or not block["toolName"]:
                        raise AdoptionError(f"{subject} {block['type']} requires a nonempty toolName")
                    if block["type"] == "tool-addition":
                        additions = True
                        if "tool" in block:
                            raise AdoptionError(f"{subject} tool-addition must omit inline tool definitions")
                if (not _seq(data.get("headerSeq"))) if additions else ("headerSeq" in data):
                    raise AdoptionError(f"{subject} requires headerSeq exactly when tool additions are present")
    if event_type == "request/header":
        if not isinstance(data, dict):
            raise AdoptionError(f"{subject} data must be an object")
        header = data.get("header")
        if not isinstance(header, dict):
            raise AdoptionError(f"{subject} header must be an object")
        if "system" in header:
            raise AdoptionError(f"{subject} must omit header.system; use system/message")
        if isinstance(header.get("tools"), list) and not header["tools"]:
            raise AdoptionError(f"{subject} must omit empty tools")
        if isinstance(header.get("adapterDefaults"), dict) and not header["adapterDefaults"]:
            raise AdoptionError(f"{subject} must omit empty adapterDefaults")
    elif event_type == "tool/result":
        if not isinstance(data, dict):
            raise AdoptionError(f"{subject} data must be an object")
        if "error" in data and not (isinstance(data.get("message"), dict) and data["message"].get("isError") is True):
            raise AdoptionError(f"{subject} error requires message.isError === true")


def _surface_op(event: dict[str, Any]) -> Any:
    """dsh's ``surfaceOpOf``: the event's operation, ``None`` for none."""
    event_type = event["type"]
    if event_type not in SURFACE_TYPES:
        if event_type not in KNOWN_TYPES and event.get("ignorable") is True:
            return None
        if "surfaceOp" in event:
            raise AdoptionError(f'session event "{event_type}" is not surface-eligible and cannot carry surfaceOp')
        if "sourceEventSeqs" in event:
            raise AdoptionError(f'session event "{event_type}" is not surface-eligible and cannot carry sourceEventSeqs')
        return None
    if "surfaceOp" not in event:
        raise AdoptionError(f'session event "{event_type}" is surface-eligible and requires a surfaceOp marker')
    op = event["surfaceOp"]
    if op == "append" and type(op) is str:
        return op
    if not isinstance(op, dict):
        raise AdoptionError(f'session event "{event_type}" carries an invalid surfaceOp')
    if (len(op) != 3 or "op" not in op or op.get("op") != "replace" or not _seq(op.get("startSeq"))
            or not _seq(op.get("endSeq"))):
        raise AdoptionError(f'session event "{event_type}" carries an invalid replace surfaceOp')
    return op


def _check_sources(event: dict[str, Any], shadowed: list[int], error: type[Exception]) -> None:
    """dsh's ``assertSourceEventReferences``."""
    event_type, seq = event["type"], event["seq"]
    if event_type == "assistant/message" and "sourceEventSeqs" in event:
        raise error("assistant/message embeds its source stream and cannot carry sourceEventSeqs")
    sources: set[int] = set()
    if "sourceEventSeqs" in event:
        raw = event["sourceEventSeqs"]
        if not isinstance(raw, list):
            raise error(f"sourceEventSeqs on event at seq {seq} must be an array when present")
        if not raw:
            raise error("sourceEventSeqs must not be empty")
        later = None
        for source in raw:
            if not _seq(source):
                raise error(f'session event "{event_type}" sourceEventSeqs must densely contain non-negative safe integers')
            sources.add(source)
            if later is None and source >= seq:
                later = source
        if len(sources) != len(raw):
            raise error("sourceEventSeqs must not contain duplicates")
        if later is not None:
            raise error(f"sourceEventSeqs must reference earlier events: {later} >= current seq {seq}")
    missing = [node for node in shadowed if node not in sources]
    if missing:
        raise error("surface replace: sourceEventSeqs must include every shadowed surface node; missing "
                    + ", ".join(map(str, missing)))


def _check_message(event: dict[str, Any], subject: str) -> None:
    """dsh's ``assertMessageEventShape``."""
    event_type = event["type"]
    if event_type not in _ROLES:
        return
    data = event["data"]
    record = data if isinstance(data, (dict, list)) else None
    message = record if event_type == "user/message" else (record.get("message") if isinstance(record, dict) else None)
    if not isinstance(message, dict) or type(message.get("id")) is not str or not message["id"]:
        raise AdoptionError(f"{subject} lacks an identified message")
    role = _ROLES[event_type]
    if message.get("role") != role:
        raise AdoptionError(f'{subject} message must have role "{role}"')
    source = message.get("source")
    if not isinstance(source, dict) or type(source.get("kind")) is not str or not source["kind"]:
        raise AdoptionError(f"{subject} message has invalid source")
    if not isinstance(message.get("content"), list):
        raise AdoptionError(f"{subject} message has invalid content")
    kind = source["kind"]
    if event_type == "system/message" and kind != "system-prompt":
        raise AdoptionError(f"{subject} message must have system-prompt source")
    if event_type == "assistant/message" and (kind != "model" or not all(
            type(source.get(key)) is str and source[key] for key in ("provider", "model"))):
        raise AdoptionError(f"{subject} message must have model source")
    if event_type == "tool/result":
        if kind != "tool" or type(source.get("callId")) is not str or not source["callId"]:
            raise AdoptionError(f"{subject} message must have tool source")
        if message.get("toolCallId") != source["callId"]:
            raise AdoptionError(f"{subject} message has mismatched tool call ids")


def adopt_event(event: dict[str, Any]) -> None:
    """dsh's ``adoptSessionEvent``: the checks of one stored event on its own."""
    subject = f"session event at seq {event['seq']}"
    _check_data(event, subject)
    op = _surface_op(event)
    if isinstance(op, dict) and (op["startSeq"] >= event["seq"] or op["endSeq"] >= event["seq"]):
        raise AdoptionError(f"surface replace at seq {event['seq']}: startSeq and endSeq must reference earlier events")
    if op is not None:
        _check_sources(event, [], AdoptionError)
    _check_message(event, subject)


def derive_message(event_type: str, data: Any) -> Any:
    """The message a surface event projects to, or ``None``."""
    if event_type == "user/message":
        return data
    if event_type in ("system/message", "developer/message", "assistant/message"):
        message = data["message"]
        return message if message["content"] else None
    if event_type == "tool/result":
        return data["message"]
    return None


def canonical_header(header: Any) -> FrozenDict:
    """dsh's ``canonicalHeader``: ``config``, ``adapterDefaults`` when a flag
    is ``true``, ``tools`` when non-empty."""
    out: dict[str, Any] = {"config": header.get("config")}
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, dict) and (defaults.get("reasoningEffort") is True or defaults.get("maxTokens") is True):
        out["adapterDefaults"] = defaults
    tools = header.get("tools")
    if isinstance(tools, (list, tuple)) and tools:
        out["tools"] = tools
    return FrozenDict(out)


def _tool_result_rest(data: Any) -> Any:
    rest = dict(data)
    rest["message"] = {**data["message"], "content": None}
    return rest


class _Surface:
    __slots__ = ("nodes", "replace_generation")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.replace_generation = 0


class V4State:
    """The fold of a v4 session's events: surface, current surface events
    and the messages image offloads projected of them, the request header
    and context in force; ``surface``, ``header``,
    ``context``, ``messages()`` and ``message_count()`` read as the v0
    :class:`~dsh_core.session.SessionState`'s do (inspect and the analysis
    read either)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.next_seq = 0
        self.last_time: int | None = None
        self.surface = _Surface()
        self._events: dict[int, tuple[str, Any]] = {}  # current surface nodes
        self._projected: dict[int, FrozenDict] = {}  # current nodes' messages as image/offload left them
        self._header_tools = ToolsBySeq()  # for developer/message headerSeq
        self.header: FrozenDict | None = None
        self.context: Any = None

    def apply(self, event: dict[str, Any]) -> None:
        """Fold one adopted event (dsh's ``planSurfaceEvent`` then apply)."""
        event_type, seq = event["type"], event["seq"]
        if seq != self.next_seq:
            raise SurfaceError(f"session event seq {seq} is not contiguous; expected {self.next_seq}")
        op = _surface_op(event)
        if event_type == "developer/message":
            self._check_developer_header(event)
        nodes = self.surface.nodes
        if event_type == "image/offload":
            self._projected.update(project_offload(event["data"], self._events, self._projected))
        elif op == "append":
            nodes.append(seq)
            self._events[seq] = (event_type, freeze(event["data"]))
        elif op is not None:
            start, end = op["startSeq"], op["endSeq"]
            if start not in nodes:
                raise SurfaceError(f"surface replace: start seq {start} not found in surface")
            if end not in nodes:
                raise SurfaceError(f"surface replace: end seq {end} not found in surface")
            first, last = nodes.index(start), nodes.index(end)
            if first > last:
                raise SurfaceError(
                    f"surface replace: start seq {start} (index {first}) is after end seq {end} (index {last})")
            shadowed = nodes[first:last + 1]
            _check_sources(event, shadowed, SurfaceError)
            if event_type == "tool/result":
                if len(shadowed) != 1:
                    raise SurfaceError("tool/result surface replacement must rewrite exactly one current node")
                original_type, original = self._events[shadowed[0]]
                if original_type != "tool/result":
                    raise SurfaceError("tool/result surface replacement must target a current tool/result")
                if not json_equal(_tool_result_rest(original), _tool_result_rest(event["data"])):
                    raise SurfaceError("tool/result surface replacement may change only content")
            if first == 0 and self._events[nodes[0]][0] == "system/message" and (
                    event_type != "system/message" or len(shadowed) != 1):
                raise SurfaceError("surface replace: node 0 holds the system prompt and may be rewritten only by "
                                   "a system/message over exactly that node")
            nodes[first:last + 1] = [seq]
            self.surface.replace_generation += 1
            for node in shadowed:
                del self._events[node]
                self._projected.pop(node, None)
            self._events[seq] = (event_type, freeze(event["data"]))
        elif event_type == "request/header":
            self.header = canonical_header(freeze(event["data"]["header"]))
            self._header_tools.add(seq, event["data"]["header"].get("tools"))
        elif event_type == "request/context":
            self.context = freeze(event["data"])
        self.next_seq = seq + 1
        self.last_time = event["time"]

    def _check_developer_header(self, event: dict[str, Any]) -> None:
        data = event["data"]
        if "headerSeq" not in data:
            return
        header_seq = data["headerSeq"]
        if header_seq >= event["seq"] or header_seq not in self._header_tools:
            raise SurfaceError("developer/message headerSeq must reference an earlier request/header")
        for block in data["message"]["content"]:
            if block.get("type") != "tool-addition":
                continue
            tools = self._header_tools.get(header_seq) or []
            definitions = [tool for tool in tools if tool.get("name") == block["toolName"]]
            if len(definitions) != 1:
                raise SurfaceError(f'developer/message tool-addition "{block["toolName"]}" must name exactly one '
                                   f"tool in headerSeq {header_seq}")
            if "deferLoading" in definitions[0] and definitions[0]["deferLoading"] is not True:
                raise SurfaceError("developer/message referenced tool deferLoading must be true when present")

    def messages(self) -> list[Any]:
        """The derived history now (a fresh list of frozen messages)."""
        out = []
        for seq in self.surface.nodes:
            message = self._projected.get(seq) or derive_message(*self._events[seq])
            if message is not None:
                out.append(message)
        return out

    #: The derived history now (v0's state caches it; here it is rebuilt).
    current_messages = messages

    def message_count(self) -> int:
        return len(self.messages())

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A fold snapshot of layout 1, saved before image offloads were
        read, holds no projected messages."""
        state.setdefault("_projected", {})
        self.__dict__.update(state)

    def surface_events(self) -> Mapping[int, tuple[str, Any]]:
        """The current surface events, seq → ``(type, frozen data)``, as
        logged (image offloads leave them as they are): a read-only live view."""
        return MappingProxyType(self._events)

