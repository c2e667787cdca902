"""The chat-completions request body dsh 0.1.1rc1 sends for a v0 log prefix.

A request is a pure function of the prefix in front of its boundary
(docs/formats/v0.md §6.2): the request header in force (``config``, ``system``,
``tools``) and the derived messages. The body is the whole of what dsh's
DeepSeek adapter serializes (``dsh-llm-deepseek``'s ``serializeRequest``)
and POSTs to ``$DEEPSEEK_BASE_URL/chat/completions``, the constant
``stream``/``stream_options`` included; the session id travels as the
``x-deepseek-harness-session-id`` header, not in the body. The adapter's
own ``thinking``/``reasoningEffort`` defaults are not in the log and are
taken as the shipped ``cordis.yml`` has them (unset): they only matter
when ``config`` has no ``reasoningEffort``, and dsh logs the effort it
filled in. A history holding an image is refused (dsh sends images as data
URLs of attachment bytes the log does not hold), and so is an effort the
adapter refuses: both raise :class:`ValidationError`.
"""

from __future__ import annotations

from typing import Any

from .errors import ValidationError
from .jsonvalue import thaw

__all__ = ["chat_completions_body"]

_EFFORTS = ("off", "low", "high", "max")
_NO_OUTPUT = "(no output)"


def _has_image(blocks: Any) -> bool:
    return any(block.get("type") == "image"
               or (block.get("type") == "tool-result" and _has_image(block.get("content", ())))
               for block in blocks)


def _text(blocks: Any) -> str:
    return "".join(block["text"] for block in blocks if block.get("type") == "text")


def _assistant(message: Any) -> dict[str, Any]:
    blocks = message["content"]
    out: dict[str, Any] = {"role": "assistant", "content": _text(blocks)}
    reasoning = "".join(block["text"] for block in blocks if block.get("type") == "reasoning")
    if reasoning:
        out["reasoning_content"] = reasoning
    calls = [{"id": block["id"], "type": "function",
              "function": {"name": block["name"], "arguments": block["arguments"]}}
             for block in blocks if block.get("type") == "tool-call"]
    if calls:
        out["tool_calls"] = calls
    return out


def _messages(history: list[Any]) -> list[dict[str, Any]]:
    """dsh's ``serializeMessages``: a non-assistant, non-system message gives
    its text as a user message (unless it is only tool results) and then each
    tool result as its own ``tool`` message; other block types travel nowhere."""
    wire: list[dict[str, Any]] = []
    for index, message in enumerate(history):
        blocks = message["content"]
        if _has_image(blocks):
            raise ValidationError(f"message {index} ({message.get('id')!r}) holds an image: dsh sends its attachment "
                                  "bytes, which the log does not hold, so the request is not rebuilt")
        role = message["role"]
        if role == "system":
            wire.append({"role": "system", "content": _text(blocks)})
        elif role == "assistant":
            wire.append(_assistant(message))
        else:
            results = [block for block in blocks if block.get("type") == "tool-result"]
            text = _text(blocks)
            if text or not results:
                wire.append({"role": "user", "content": text})
            wire.extend({"role": "tool", "tool_call_id": block["toolCallId"],
                         "content": _text(block["content"]) or _NO_OUTPUT} for block in results)
    return wire


def _thinking(config: Any) -> dict[str, Any]:
    if "reasoningEffort" not in config:
        return {}
    effort = config["reasoningEffort"]
    if effort not in _EFFORTS:
        raise ValidationError(f"dsh's DeepSeek adapter does not support reasoning effort {effort!r}")
    if effort == "off":
        return {"thinking": {"type": "disabled"}}
    return {"thinking": {"type": "enabled"}, "reasoning_effort": effort}


def chat_completions_body(header: Any, history: list[Any]) -> dict[str, Any]:
    """The chat-completions body for a prefix whose folded request header is
    ``header`` and whose derived messages are ``history`` (frozen or plain)."""
    config = header["config"]
    messages = [{"role": "system", "content": header["system"]}] if "system" in header else []
    messages.extend(_messages(history))
    body: dict[str, Any] = {"model": config["model"], "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}, **_thinking(config)}
    if header.get("tools"):
        body["tools"] = [{"type": "function", "function": {"name": tool["name"], "description": tool["description"],
                                                           "parameters": thaw(tool["parameters"])}}
                         for tool in header["tools"]]
    if "temperature" in config:
        body["temperature"] = config["temperature"]
    if "maxTokens" in config:
        body["max_tokens"] = config["maxTokens"]
    if "stop" in config:
        body["stop"] = thaw(config["stop"])
    return body
