"""A session's turns, steps and tool calls as OpenTelemetry GenAI spans.

:class:`SpanMapper` follows one session's storage lines in seq order (any
format: v0 events and packed rows, v3/v4 rows) and returns each span when it
ends, following the GenAI semantic conventions of :data:`SEMCONV_VERSION`:

- ``invoke_agent dsh`` per turn (``turn/start`` to ``turn/end``), the parent
  of the turn's other spans, with the turn's summed usage;
- ``chat {model}`` per model response (``step/start``, or the message itself
  where no step is open, to its ``assistant/message``): request and response
  model, usage, finish reasons, the response id, time to first chunk;
- ``execute_tool {name}`` per tool call (``tool/call`` to its ``tool/result``).

Every span carries ``gen_ai.conversation.id`` and ``session.id`` (the session
id), ``gen_ai.provider.name`` and ``dsh.seq`` (the seq that opened it). Its
ids are derived, never random: the trace id from the session id, the span
id from the session id and that seq, so reading the same log again gives
the same ids. Times are the log's own event times (:mod:`dsh_core.event_time`).

Message content (``gen_ai.input.messages`` and ``gen_ai.output.messages``,
tool arguments and results) is opt-in (``content``), each attribute cut at
:data:`~consumers.otel.event_fields.CONTENT_CHARS` characters. The input messages of a
``chat`` span are those the log added since the previous model response (the
user's message, tool results), not the whole history each request resent:
the earlier ones are on the earlier spans of the same trace.

A mapper's state is a msgspec Struct (:meth:`SpanMapper.state`), saved by
the exporter after each export, so a restart goes on where the export
stopped. Lines it does not map (other event types, packed chunk rows beyond
their times, malformed data) change nothing but the times they carry.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import msgspec

from dsh_core.event_time import line_time

from .event_fields import (USAGE_ATTRIBUTES, as_dict, as_int, as_list, as_str, capped, content_blocks, decode_event,
                           finish_reason, message_parts, result_text, stream_finish, usage_counts)

__all__ = ["AttributeValue", "GenAISpan", "MapperState", "SEMCONV_VERSION", "SCHEMA_URL", "SpanMapper",
           "provider_name", "span_id", "trace_id"]

#: The OpenTelemetry semantic conventions release whose GenAI attributes the
#: spans follow (the one the locked ``opentelemetry-semantic-conventions`` carries).
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

AttributeValue = str | int | float | bool | list[str]

_WATCHED = frozenset({"turn/start", "turn/end", "step/start", "step/end", "request/header", "assistant/chunk",
                      "assistant/message", "tool/call", "tool/result", "user/message"})


class GenAISpan(msgspec.Struct, frozen=True, kw_only=True):
    """One finished span, ready to export (times in ms since the epoch)."""

    name: str
    kind: Literal["client", "internal"]
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ms: int
    end_ms: int
    attributes: dict[str, AttributeValue]
    error: str | None = None  # ``error.type``; the span's status is an error when set


class _Open(msgspec.Struct, kw_only=True):
    """A span started and not ended yet."""

    seq: int
    start_ms: int
    number: int | None = None  # the turn's or step's number
    name: str = ""  # a tool's
    call_id: str = ""  # a tool call's id
    arguments: str | None = None  # a tool call's, kept only with content
    output_ms: int | None = None  # a step's first model output
    finish: str | None = None  # a step's finish reason
    usage: dict[str, int] = msgspec.field(default_factory=dict)  # a turn's totals
    model: str | None = None  # the response model a turn last saw


class MapperState(msgspec.Struct, kw_only=True):
    """What a :class:`SpanMapper` needs to go on (saved between exports)."""

    version: int = 1
    provider: str | None = None  # dsh's provider id, from the request header
    model: str | None = None  # the request model, from the request header
    turn: _Open | None = None
    step: _Open | None = None
    tools: list[_Open] = msgspec.field(default_factory=list)
    inputs: list[dict[str, Any]] = msgspec.field(default_factory=list)  # messages since the last response (content)


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(MapperState)


def trace_id(session_id: str) -> int:
    """The session's trace id (128 bits, never 0)."""
    return int.from_bytes(hashlib.sha256(b"dsh-trace\0" + session_id.encode()).digest()[:16], "big") or 1


def span_id(session_id: str, seq: int, operation: str) -> int:
    """The id of the span ``operation`` opened at ``seq`` (64 bits, never 0)."""
    digest = hashlib.sha256(f"dsh-span\0{session_id}\0{seq}\0{operation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def provider_name(provider: str | None) -> str:
    """``gen_ai.provider.name`` of a dsh provider id: ``deepseek`` for
    DeepSeek's (``deepseek-official``, ...), else the id as dsh names it."""
    if not provider:
        return "deepseek"  # dsh is DeepSeek's harness; a log naming none used its default
    return "deepseek" if provider.startswith("deepseek") else provider


class SpanMapper:
    """The spans of one session, fed its storage lines in seq order."""

    def __init__(self, session_id: str, content: bool = False, state: bytes | None = None) -> None:
        self.session_id = session_id
        self.content = content
        self.trace = trace_id(session_id)
        self.current = _state_decoder.decode(state) if state else MapperState()

    def state(self) -> bytes:
        """The state to save (restored by passing it to the constructor)."""
        return _state_encoder.encode(self.current)

    def feed(self, line: bytes) -> list[GenAISpan]:
        """Map one storage line; returns the spans it ended."""
        times = line_time(line)
        if times is None or times.type not in _WATCHED:
            return self._note_output(times)
        event = decode_event(line)
        if event is None:
            return []
        seq, data = event.get("seq"), event.get("data")
        if type(seq) is not int or not isinstance(data, dict):
            return []
        return self._event(times.type, seq, times.first, data, times.output_at)

    def _note_output(self, times: Any) -> list[GenAISpan]:
        step = self.current.step
        if times is not None and times.output_at is not None and step is not None and step.output_ms is None:
            step.output_ms = times.output_at  # a packed chunk row: the first model output of the step
        return []

    def _event(self, kind: str, seq: int, at: int, data: dict[str, Any], output_at: int | None) -> list[GenAISpan]:
        state = self.current
        if kind == "turn/start":
            ended = self._end_turn(at, None, "turn-not-ended") if state.turn is not None else []
            state.turn = _Open(seq=seq, start_ms=at, number=as_int(data.get("turn")))
            return ended
        if kind == "turn/end":
            return self._end_turn(at, data.get("reason"), None) if state.turn is not None else []
        if kind == "step/start":
            state.step = _Open(seq=seq, start_ms=at, number=as_int(data.get("step")))
        elif kind == "step/end":
            state.step = None
        elif kind == "request/header":
            config = as_dict(as_dict(data.get("header")).get("config"))
            state.provider = as_str(config.get("provider")) or state.provider
            state.model = as_str(config.get("model")) or state.model
        elif kind == "assistant/chunk":
            self._chunk(at, as_dict(data.get("chunk")))
        elif kind == "assistant/message":
            return [self._chat(seq, at, data, output_at)]
        elif kind == "tool/call":
            state.tools.append(_Open(seq=seq, start_ms=at, name=as_str(data.get("name")) or "",
                                     call_id=as_str(data.get("callId")) or "",
                                     arguments=as_str(data.get("arguments")) if self.content else None))
        elif kind == "tool/result":
            return self._tool_result(at, data)
        elif kind == "user/message" and self.content:
            state.inputs.append({"role": "user", "parts": message_parts(content_blocks(data))})
        return []

    def _chunk(self, at: int, chunk: dict[str, Any]) -> None:
        step = self.current.step
        if step is None:
            return
        if step.output_ms is None and chunk.get("type") != "finish":
            step.output_ms = at
        if chunk.get("type") == "finish":
            step.finish = finish_reason(chunk.get("reason"))

    # ------------------------------------------------------------- spans

    def _common(self, seq: int, operation: str) -> dict[str, AttributeValue]:
        return {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider_name(self.current.provider),
                "gen_ai.conversation.id": self.session_id, "session.id": self.session_id, "dsh.seq": seq}

    def _parent(self) -> int | None:
        turn = self.current.turn
        return span_id(self.session_id, turn.seq, "invoke_agent") if turn is not None else None

    def _chat(self, seq: int, at: int, data: dict[str, Any], output_at: int | None) -> GenAISpan:
        state = self.current
        message = as_dict(data.get("message")) or data  # v0 before its upgrade: content and provenance on data
        source = as_dict(message.get("source")) or as_dict(data.get("provenance"))
        step = state.step
        opened = step if step is not None else _Open(seq=seq, start_ms=at)
        response_model = as_str(source.get("model"))
        provider = as_str(source.get("provider"))
        if provider and not state.provider:
            state.provider = provider
        attributes = self._common(opened.seq, "chat")
        request_model = state.model or response_model
        if request_model:
            attributes["gen_ai.request.model"] = request_model
        if response_model:
            attributes["gen_ai.response.model"] = response_model
        if as_str(message.get("id")):
            attributes["gen_ai.response.id"] = message["id"]
        usage = usage_counts(data.get("usage"))
        attributes.update({USAGE_ATTRIBUTES[name]: value for name, value in usage.items()})
        finish = (step.finish if step is not None else None) or stream_finish(data.get("stream"))
        if finish is None and data.get("interrupted") is True:
            finish = "interrupted"
        if finish is not None:
            attributes["gen_ai.response.finish_reasons"] = [finish]
        first_output = output_at if output_at is not None else opened.output_ms
        if first_output is not None and first_output >= opened.start_ms:
            attributes["gen_ai.response.time_to_first_chunk"] = (first_output - opened.start_ms) / 1000
        if step is not None and step.number is not None:
            attributes["dsh.step"] = step.number
        if self.content:
            attributes["gen_ai.input.messages"] = capped(json.dumps(state.inputs, ensure_ascii=False))
            # the conventions' output message always names its finish reason: a log that does not say says so
            output: dict[str, Any] = {"role": "assistant", "parts": message_parts(content_blocks(message)),
                                      "finish_reason": finish if finish is not None else "unknown"}
            attributes["gen_ai.output.messages"] = capped(json.dumps([output], ensure_ascii=False))
            state.inputs = []
        if state.turn is not None:
            totals = state.turn.usage
            for name, value in usage.items():
                totals[name] = totals.get(name, 0) + value
            state.turn.model = response_model or state.turn.model
        name = f"chat {request_model}" if request_model else "chat"
        return GenAISpan(name=name, kind="client", trace_id=self.trace,
                         span_id=span_id(self.session_id, opened.seq, "chat"), parent_id=self._parent(),
                         start_ms=opened.start_ms, end_ms=max(at, opened.start_ms), attributes=attributes,
                         error="error" if finish == "error" else None)

    def _tool_result(self, at: int, data: dict[str, Any]) -> list[GenAISpan]:
        message = as_dict(data.get("message"))
        call_id = (as_str(data.get("callId")) or as_str(message.get("toolCallId"))
                   or as_str(as_dict(message.get("source")).get("callId")))
        call = next((tool for tool in self.current.tools if tool.call_id == call_id), None)
        if call is None:
            return []
        self.current.tools.remove(call)
        content = content_blocks(message) if message else data.get("content")
        failed = data.get("isError") is True or message.get("isError") is True or any(
            isinstance(part, dict) and part.get("isError") is True for part in as_list(content))
        if self.content:
            self.current.inputs.append({"role": "tool", "parts": [
                {"type": "tool_call_response", "id": call_id, "response": result_text(content)}]})
        return [self._tool_span(call, at, "tool-error" if failed else None, result_text(content))]

    def _tool_span(self, call: _Open, end_ms: int, error: str | None, result: str | None) -> GenAISpan:
        attributes = self._common(call.seq, "execute_tool")
        attributes.update({"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.call_id,
                           "gen_ai.tool.type": "function"})
        if self.content:
            if call.arguments is not None:
                attributes["gen_ai.tool.call.arguments"] = capped(call.arguments)
            if result is not None:
                attributes["gen_ai.tool.call.result"] = capped(result)
        return GenAISpan(name=f"execute_tool {call.name}".rstrip(), kind="internal", trace_id=self.trace,
                         span_id=span_id(self.session_id, call.seq, "execute_tool"), parent_id=self._parent(),
                         start_ms=call.start_ms, end_ms=max(end_ms, call.start_ms), attributes=attributes,
                         error=error)

    def _end_turn(self, at: int, reason: Any, error: str | None) -> list[GenAISpan]:
        """The turn's span, after those of its tool calls left without a result."""
        state = self.current
        turn = state.turn
        assert turn is not None
        ended = [self._tool_span(call, at, "no-result", None) for call in state.tools]
        state.tools, state.step = [], None
        attributes = self._common(turn.seq, "invoke_agent")
        attributes["gen_ai.agent.name"] = "dsh"
        if state.model:
            attributes["gen_ai.request.model"] = state.model
        if turn.model:
            attributes["gen_ai.response.model"] = turn.model
        attributes.update({USAGE_ATTRIBUTES[name]: value for name, value in turn.usage.items()})
        if turn.number is not None:
            attributes["dsh.turn"] = turn.number
        kind = as_str(as_dict(reason).get("kind"))
        if kind:
            attributes["dsh.turn.end_reason"] = kind
        if error is None and kind == "error":
            error = "turn-error"
        ended.append(GenAISpan(name="invoke_agent dsh", kind="internal", trace_id=self.trace,
                               span_id=span_id(self.session_id, turn.seq, "invoke_agent"), parent_id=None,
                               start_ms=turn.start_ms, end_ms=max(at, turn.start_ms), attributes=attributes,
                               error=error))
        state.turn = None
        return ended
