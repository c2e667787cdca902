"""The lifecycle of a v4 log, checked as dsh 0.2.1 checks it on load (the
``Relationships`` pass of ``assertReleasedV4Relationships``).

Turns and steps open and close in order; events that belong to a step name
the open one; every tool call an assistant message advertises is started
by one matching ``tool/call`` and settled by one ``tool/result`` before its
step ends; retries, compactions, titles and commands refer only to what
they may. A log that ends inside a turn (a crash) keeps its open state:
nothing is required of a tail. Refusals are
:class:`~dsh_core.formats.v4.relationships.RelationshipError` with dsh's text.
"""

from __future__ import annotations

from typing import Any

from .lifecycle_checks import _deep_equal, _js_equal, _not_started_repair, _same_int
from .lookback import NO_SOURCE, ToolsBySeq, check_title_sources
from .relationships import ABSENT, RelationshipError, _array, _count, _earlier, _record, _text
from .vocabulary import KNOWN_TYPES, SURFACE_TYPES

__all__ = ["Relationships"]

_STEP_TYPES = frozenset({"system/message", "developer/message", "assistant/attempt"})
_RELATIONSHIP_TYPES = SURFACE_TYPES | _STEP_TYPES | {
    "turn/start", "turn/end", "step/start", "step/end", "tool/call", "request/header", "request/context",
    "tool/ptc-dispatch-start", "tool/ptc-dispatch", "llm/retry", "llm/retry-started", "session/title",
    "session/title-llm-request", "command/run", "command/done", "compaction/start", "compaction/summary",
    "compaction/end", "compaction/prune", "session/end-seed"}

class _Compaction:
    __slots__ = ("id", "command", "turn", "seq", "summarized")

    def __init__(self, compaction_id: str, command: Any, turn: Any, seq: int) -> None:
        self.id, self.command, self.turn, self.seq, self.summarized = compaction_id, command, turn, seq, False


class Relationships:
    """The lifecycle state of one log, fed event by event (dsh's
    ``Relationships``). dsh decides up front which compactions a resume cut
    off (no ``compaction/end`` before the next ``session/end-seed``); fed
    one event at a time, a turn that crosses an open compaction waits for
    that answer, and so does any later refusal."""

    def __init__(self) -> None:
        self.turn: int | None = None
        self.step: int | None = None
        self.next_turn = 1
        self.next_step = 1
        self.provider: Any = None
        self.surface: list[int] = []
        self.protected_head: int | None = None
        self.compaction: _Compaction | None = None
        self.tools: dict[str, dict[str, Any]] = {}
        self.dispatches: dict[str, dict[str, Any]] = {}
        self.retries: list[dict[str, Any]] = []
        self.started_retries: set[tuple[str, int]] = set()
        self.commands: set[str] = set()
        # what later events look back at: every type, request headers, user message sources
        self.types: list[str] = []
        self.header_tools = ToolsBySeq()
        self.user_kinds: dict[int, Any] = {}  # the source kind of each user/message (NO_SOURCE: none)
        # compactions a resume cut off, as far as the log has been read
        self._open_start: int | None = None
        self._cut_off: set[int] = set()
        self._completed: set[int] = set()
        self._crossing: tuple[int, RelationshipError] | None = None  # waits for its compaction's fate
        self._held: RelationshipError | None = None  # a refusal after a waiting crossing
        self.error: RelationshipError | None = None

    def feed(self, event: dict[str, Any]) -> None:
        """Follow one event; a refusal lands in :attr:`error` (once decided)."""
        event_type, seq = event["type"], event["seq"]
        self.types.append(event_type)
        if event_type not in KNOWN_TYPES:
            return
        data = event["data"]
        if event_type == "request/header":
            self.header_tools.add(seq, data["header"].get("tools"))
        elif event_type == "user/message":
            source = data.get("source") if isinstance(data, dict) else None
            self.user_kinds[seq] = source.get("kind") if isinstance(source, dict) else NO_SOURCE
        self._follow_compactions(event_type, seq)
        if self.error is not None or self._held is not None:
            return
        try:
            self.accept(event)
        except RelationshipError as exc:
            if self._crossing is None:
                self.error = exc
            else:
                self._held = exc

    def _follow_compactions(self, event_type: str, seq: int) -> None:
        if event_type == "compaction/start":
            if self._open_start is not None:
                self._decided(self._open_start, cut_off=False)
            self._open_start = seq
        elif event_type == "compaction/end" and self._open_start is not None:
            self._decided(self._open_start, cut_off=False)
            self._open_start = None
        elif event_type == "session/end-seed" and self._open_start is not None:
            self._decided(self._open_start, cut_off=True)
            self._open_start = None

    def _decided(self, start: int, cut_off: bool) -> None:
        (self._cut_off if cut_off else self._completed).add(start)
        if self._crossing is not None and self._crossing[0] == start:
            crossing, self._crossing = self._crossing[1], None
            if not cut_off:
                self.error = crossing
            elif self._held is not None:
                self.error, self._held = self._held, None

    def finish(self) -> None:
        """The end of the log decides a compaction still open: not cut off."""
        if self._open_start is not None:
            self._decided(self._open_start, cut_off=False)
            self._open_start = None

    def require_turn(self, event_type: str) -> None:
        if self.turn is None:
            raise RelationshipError(f"{event_type} is outside an open turn")

    def require_step(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        if (self.turn is None or self.step is None or not _same_int(data.get("turn"), self.turn)
                or not _same_int(data.get("step"), self.step)):
            raise RelationshipError(f"{event['type']} does not match an open turn and step")

    def close_tools(self, event_type: str) -> None:
        if self.tools:
            raise RelationshipError(f"{event_type} leaves unresolved tool call {next(iter(self.tools))}")

    def developer(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        if "headerSeq" not in data:
            return
        header_seq = _earlier(data["headerSeq"], event["seq"], "developer/message headerSeq")
        if self.types[header_seq] != "request/header":
            raise RelationshipError("developer/message headerSeq must reference an earlier request/header")
        tools = self.header_tools.get(header_seq)
        content = _array(_record(data.get("message"), "developer message").get("content"), "developer content")
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool-addition":
                continue
            name = block.get("toolName")
            definitions = [tool for tool in tools if isinstance(tool, dict) and tool.get("name") == name] \
                if isinstance(tools, list) else []
            if len(definitions) != 1:
                raise RelationshipError(
                    f'developer/message tool-addition "{name}" must name exactly one tool in headerSeq {header_seq}')
            if type(definitions[0].get("description")) is not str or not isinstance(definitions[0].get("parameters"), dict):
                raise RelationshipError(f'developer/message tool-addition "{name}" requires a complete tool '
                                        f"definition in headerSeq {header_seq}")

    def fold_surface(self, event: dict[str, Any]) -> None:
        event_type, seq = event["type"], event["seq"]
        if event_type not in SURFACE_TYPES:
            return
        if event_type == "system/message" and self.surface and self.protected_head is None:
            raise RelationshipError("system/message requires a protected first surface head")
        if event.get("surfaceOp") == "append":
            if event_type == "system/message" and not self.surface:
                self.protected_head = seq
            self.surface.append(seq)
            return
        operation = _record(event.get("surfaceOp"), f"{event_type} surfaceOp")
        start = _earlier(operation.get("startSeq"), seq, "replacement start")
        end = _earlier(operation.get("endSeq"), seq, "replacement end")
        first = self.surface.index(start) if start in self.surface else -1
        last = self.surface.index(end) if end in self.surface else -1
        if first < 0 or last < first:
            raise RelationshipError(f"{event_type} replacement range is not on the current surface")
        removed = self.surface[first:last + 1]
        sources = _array(event.get("sourceEventSeqs"), "replacement sourceEventSeqs")
        if any(node not in sources for node in removed):
            raise RelationshipError("replacement sourceEventSeqs omit a shadowed surface node")
        if self.protected_head is not None and self.protected_head in removed:
            if event_type != "system/message" or len(removed) != 1:
                raise RelationshipError("surface replacement cannot shadow the protected system head")
            self.protected_head = seq
        self.surface[first:last + 1] = [seq]

    def tool(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        event_type = event["type"]
        if event_type == "tool/result" and event.get("surfaceOp") != "append":
            self.require_turn(event_type)
            return
        self.require_step(event, data)
        if event_type == "assistant/message":
            message = _record(data.get("message"), "assistant message")
            for value in _array(message.get("content"), "assistant content"):
                block = _record(value, "assistant content block")
                if block.get("type") != "tool-call":
                    continue
                call_id = _text(block.get("id"), "tool call id")
                if call_id in self.tools:
                    raise RelationshipError(f"assistant/message repeats advertised tool call {call_id}")
                self.tools[call_id] = {"name": block.get("name"), "arguments": block.get("arguments"), "started": False}
            return
        result = _record(data.get("message"), "tool result message") if event_type == "tool/result" else None
        call_id = _text(data.get("callId") if result is None else result.get("toolCallId"), "tool call id")
        pending = self.tools.get(call_id)
        if pending is None:
            raise RelationshipError(f"{event_type} {call_id} has no advertised tool lifecycle")
        if result is None:
            if pending["started"] or not _js_equal(pending["name"], data.get("name")) \
                    or not _js_equal(pending["arguments"], data.get("arguments")):
                raise RelationshipError(f"tool/call {call_id} does not match one advertised tool call")
            pending["started"] = True
        else:
            if not pending["started"] and not _not_started_repair(event, data, result, call_id):
                raise RelationshipError(f"tool/result {call_id} is not the exact TOOL_NOT_STARTED repair")
            del self.tools[call_id]

    def dispatch(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        self.require_turn(event["type"])
        sub = _text(data.get("subCallId"), "PTC subCallId")
        root = _text(data.get("rootCallId"), "PTC rootCallId")
        parent = _text(data.get("parentCallId"), "PTC parentCallId")
        existing = self.dispatches.get(sub)
        if existing is not None and existing["data"].get("rootCallId") != root:
            raise RelationshipError("PTC dispatch changes its rootCallId")
        if parent != root and (self.dispatches.get(parent) or {"data": {}})["data"].get("rootCallId") != root:
            raise RelationshipError("PTC parentCallId does not belong to rootCallId")
        if event["type"] == "tool/ptc-dispatch-start":
            if existing is not None:
                raise RelationshipError("PTC dispatch repeats subCallId")
            self.dispatches[sub] = {"data": data, "settled": False}
            return
        if existing is None or existing["settled"]:
            raise RelationshipError("PTC dispatch has no unique start")
        if any(not _deep_equal(existing["data"].get(key, ABSENT), data.get(key, ABSENT))
               for key in ("rootCallId", "parentCallId", "name", "arguments")):
            raise RelationshipError("PTC dispatch does not match its start")
        existing["settled"] = True

    def retry(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        retry_id = _text(data.get("retryId"), "retryId")
        attempt = _count(data.get("retry"), "retry")
        if event["type"] == "llm/retry-started":
            scheduled = next((item for item in self.retries
                              if item.get("retryId") == retry_id and item.get("retry") == attempt), None)
            if scheduled is None:
                raise RelationshipError("llm/retry-started pairs no prior scheduled attempt")
            if not _js_equal(scheduled.get("turn"), data.get("turn")) or not _js_equal(scheduled.get("step"), data.get("step")):
                raise RelationshipError("llm/retry-started changes scheduled coordinates")
            key = (retry_id, attempt)
            if key in self.started_retries:
                raise RelationshipError("llm/retry-started repeats one scheduled attempt")
            self.started_retries.add(key)
            return
        step = self.step if self.step is not None else self.next_step - 1
        if self.turn is None or not _same_int(data.get("turn"), self.turn) or not _same_int(data.get("step"), step):
            raise RelationshipError("llm/retry does not match the current turn and step")
        if not _js_equal(data.get("provider"), self.provider):
            raise RelationshipError("llm/retry provider does not match the open request/header")
        prior = next((item for item in reversed(self.retries)
                      if all(_js_equal(item.get(key), data.get(key)) for key in ("turn", "step", "provider", "policyKey"))),
                     None)
        if attempt != (1 if prior is None else _count(prior.get("retry"), "prior retry") + 1):
            raise RelationshipError("llm/retry skips its policy attempt sequence")
        if (any(item.get("retryId") == retry_id for item in self.retries) if prior is None
                else prior.get("retryId") != retry_id):
            raise RelationshipError("llm/retry must keep one retryId per policy chain")
        self.retries.append(data)

    def compact(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        event_type = event["type"]
        if event_type in ("compaction/prune", "compaction/summary"):
            self.span(event, data)
        if event_type == "compaction/prune":
            return
        if event_type == "compaction/start":
            if self.compaction is not None:
                raise RelationshipError("compaction/start overlaps an open compaction")
            owner = None if data.get("turn", ABSENT) is None else _count(data.get("turn"), "compaction turn")
            if owner != self.turn:
                raise RelationshipError("compaction/start does not match the open turn")
            self.compaction = _Compaction(_text(data.get("compactionId"), "compactionId"),
                                          data.get("sourceCommandId", ABSENT), owner, event["seq"])
            return
        current = self.compaction_owner(data, event_type)
        if current.turn != self.turn:
            raise RelationshipError(f"{event_type} does not match the open turn")
        if event_type == "compaction/summary":
            if current.summarized:
                raise RelationshipError("compaction/summary repeats")
            current.summarized = True
        else:
            if not _js_equal(data.get("turn", ABSENT), current.turn):
                raise RelationshipError("compaction/end changes its owner turn")
            if "error" not in data and not current.summarized:
                raise RelationshipError("successful compaction/end requires one summary")
            self.compaction = None

    def compaction_owner(self, data: dict[str, Any], subject: str) -> _Compaction:
        current = self.compaction
        if (current is None or current.id != data.get("compactionId")
                or not _js_equal(current.command, data.get("sourceCommandId", ABSENT))):
            raise RelationshipError(f"{subject} has no matching compaction/start")
        return current

    def span(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        shadowed = _record(data.get("shadowedRange"), "compaction shadowedRange")
        start_seq = _earlier(shadowed.get("start"), event["seq"], "compaction range start")
        end_seq = _earlier(shadowed.get("end"), event["seq"], "compaction range end")
        start = self.surface.index(start_seq) if start_seq in self.surface else -1
        end = self.surface.index(end_seq) if end_seq in self.surface else -1
        seqs = _array(data.get("shadowedSeqs"), "compaction shadowedSeqs")
        if start < 0 or end < start or not _deep_equal(self.surface[start:end + 1], seqs):
            raise RelationshipError(f"{event['type']} shadowedSeqs do not name an exact current surface span")
        if self.protected_head is not None and self.protected_head in seqs:
            raise RelationshipError("compaction cannot shadow the protected system head")

    def title_sources(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        check_title_sources(self.types, self.user_kinds, event, data)

    def accept(self, event: dict[str, Any]) -> None:
        event_type = event["type"]
        if event_type not in KNOWN_TYPES or event_type not in _RELATIONSHIP_TYPES:
            return
        data = _record(event["data"], event_type)
        if event_type in _STEP_TYPES:
            self.require_step(event, data)
        if event_type.startswith("turn/") and self.compaction is not None:
            start = self.compaction.seq
            crossing = RelationshipError(f"{event_type} crosses an open compaction")
            if start in self._completed:
                raise crossing
            if start not in self._cut_off and self._crossing is None:
                self._crossing = (start, crossing)
        self.fold_surface(event)
        if event_type == "turn/start":
            if self.turn is not None or not _same_int(data.get("turn"), self.next_turn):
                raise RelationshipError("turn/start does not open the expected turn")
            self.turn, self.next_step = self.next_turn, 1
            self.tools.clear()
        elif event_type == "turn/end":
            if self.turn is None or not _same_int(data.get("turn"), self.turn) or self.step is not None:
                raise RelationshipError("turn/end does not match the open turn with no open step")
            self.close_tools(event_type)
            self.turn = None
            self.next_turn += 1
        elif event_type == "step/start":
            if (self.turn is None or not _same_int(data.get("turn"), self.turn) or self.step is not None
                    or not _same_int(data.get("step"), self.next_step)):
                raise RelationshipError("step/start does not match the open turn and next step")
            self.step = self.next_step
        elif event_type == "step/end":
            self.require_step(event, data)
            self.close_tools(event_type)
            self.step = None
            self.next_step += 1
        elif event_type in ("assistant/message", "tool/call", "tool/result"):
            self.tool(event, data)
        elif event_type == "developer/message":
            self.developer(event, data)
        elif event_type == "request/header":
            self.require_turn(event_type)
            config = _record(_record(data.get("header"), "request header").get("config"), "request config")
            self.provider = config.get("provider")
        elif event_type == "request/context":
            self.require_turn(event_type)
        elif event_type in ("tool/ptc-dispatch-start", "tool/ptc-dispatch"):
            self.dispatch(event, data)
        elif event_type in ("llm/retry", "llm/retry-started"):
            self.retry(event, data)
        elif event_type in ("session/title", "session/title-llm-request"):
            self.title_sources(event, data)
        elif event_type == "command/run":
            command_id = _text(data.get("commandId"), "commandId")
            if command_id in self.commands:
                raise RelationshipError(f"command/run repeats commandId {command_id}")
            self.commands.add(command_id)
        elif event_type == "command/done":
            if _text(data.get("commandId"), "commandId") not in self.commands:
                raise RelationshipError("command/done has no prior command/run")
            if "sourceEventSeq" in data:
                source = self.types[_earlier(data["sourceEventSeq"], event["seq"], "command sourceEventSeq")]
                if data.get("kind") != "success" or source in ("command/run", "command/done"):
                    raise RelationshipError("command/done has invalid sourceEventSeq")
        elif event_type.startswith("compaction/"):
            self.compact(event, data)
        elif event_type == "user/message":
            user_source = _record(data.get("source"), "user message source")
            if event.get("surfaceOp") != "append" and user_source.get("kind") == "compact-checkpoint":
                self.compaction_owner(user_source, "compaction checkpoint")
        elif event_type == "session/end-seed":
            self.compaction = None

