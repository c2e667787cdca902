"""Reading a dsh log's event data for the span mapper: storage lines decoded
(never raising: malformed data maps to nothing), fields taken only when they
have the expected type, and dsh's values as the GenAI conventions' (finish
reasons, usage counter attributes, content blocks as message parts, content
attributes cut at :data:`CONTENT_CHARS`)."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["CONTENT_CHARS", "USAGE_ATTRIBUTES", "as_dict", "as_int", "as_list", "as_str", "capped", "content_blocks",
           "decode_event", "finish_reason", "message_parts", "result_text", "stream_finish", "usage_counts"]

#: dsh's finish kinds as the conventions' ``finish_reason`` values.
_FINISH_REASONS = {"stop": "stop", "tool-calls": "tool_call", "max-tokens": "length", "error": "error",
                   "content-filter": "content_filter"}
#: dsh's usage counters and the attributes they become.
USAGE_ATTRIBUTES = {"inputTokens": "gen_ai.usage.input_tokens", "outputTokens": "gen_ai.usage.output_tokens",
                    "cacheReadTokens": "gen_ai.usage.cache_read.input_tokens",
                    "cacheWriteTokens": "gen_ai.usage.cache_creation.input_tokens"}
#: Characters kept of one content attribute (a tool's output can be megabytes;
#: receivers refuse requests of a few MiB): the rest is cut, and says how much.
CONTENT_CHARS = 32 * 1024

_event_decoder = msgspec.json.Decoder()


def decode_event(line: bytes) -> dict[str, Any] | None:
    try:
        event = _event_decoder.decode(line)
    except msgspec.DecodeError:
        return None
    return event if isinstance(event, dict) else None


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def as_int(value: Any) -> int | None:
    return value if type(value) is int else None


def usage_counts(value: Any) -> dict[str, int]:
    return {name: count for name, count in as_dict(value).items() if name in USAGE_ATTRIBUTES and type(count) is int}


def finish_reason(reason: Any) -> str | None:
    kind = as_str(as_dict(reason).get("kind"))
    return _FINISH_REASONS.get(kind, kind) if kind else None


def stream_finish(stream: Any) -> str | None:
    """The finish reason a v3/v4 message keeps among its streamed chunks."""
    for entry in reversed(as_list(stream)):
        chunk = as_dict(as_dict(entry).get("chunk"))
        if chunk.get("type") == "finish":
            return finish_reason(chunk.get("reason"))
    return None


def capped(text: str) -> str:
    """``text``, or its first :data:`CONTENT_CHARS` characters and how many were cut."""
    if len(text) <= CONTENT_CHARS:
        return text
    return f"{text[:CONTENT_CHARS]}… [{len(text) - CONTENT_CHARS} more characters not exported]"


def content_blocks(message: dict[str, Any]) -> list[Any]:
    return as_list(message.get("content"))


def message_parts(content: list[Any]) -> list[dict[str, Any]]:
    """dsh content blocks as the conventions' message parts."""
    parts: list[dict[str, Any]] = []
    for block in content:
        block = as_dict(block)
        kind = block.get("type")
        if kind in ("text", "reasoning"):
            parts.append({"type": kind, "content": block.get("text", "")})
        elif kind == "tool-call":
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                          "arguments": block.get("arguments")})
        elif kind == "tool-result":
            parts.append({"type": "tool_call_response", "id": block.get("toolCallId"),
                          "response": result_text(block.get("content"))})
        elif kind is not None:
            parts.append({"type": str(kind)})
    return parts


def result_text(content: Any) -> str | None:
    """A tool result's text (its text blocks, nested tool-result blocks too)."""
    texts: list[str] = []
    for block in as_list(content):
        block = as_dict(block)
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool-result":
            nested = result_text(block.get("content"))
            if nested is not None:
                texts.append(nested)
    return "".join(texts) if texts else None
