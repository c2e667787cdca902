"""The Messages request body dsh 0.2.1 sends for a v4 log prefix.

A request is a pure function of the prefix in front of its
``assistant/message`` or ``assistant/attempt``: the request header in
force (``config``, ``tools``), the latest ``request/context`` (whether a
changed system prompt travels ``in-history``) and the derived messages.
The body is what dsh's DeepSeek adapter serializes (its ``serialize``),
without the fields dsh's plugins add around it (``dsh_session_log``,
``dsh_plugin_packages``). An image an ``image/offload`` marked travels as
the placeholder text an image-capable route sends (the only kind that
offloads), which names the read-only path of the image's normalized copy
when the runtime resolves one: the log does not hold it, so the caller
says (``image_path``). A history the adapter cannot serialize, or an image
sent as itself (uploaded or inline bytes), raises :class:`WireError`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from ...errors import DecodeError, ValidationError
from ...json_depth import bounded
from .images import IMAGE_EXTENSIONS, offloaded_image_text

__all__ = ["DEFAULT_MAX_TOKENS", "WireError", "messages_body"]

#: dsh-llm-deepseek's default ``max_tokens``.
DEFAULT_MAX_TOKENS = 256_000
_EFFORTS = ("off", "low", "high", "max")
#: Resolves an offloaded image's attachment to the read-only path of its normalized copy, or ``None`` for none.
ImagePath = Callable[[Mapping[str, Any]], str | None]


class WireError(ValidationError):
    """A history dsh's Messages serializer refuses."""


_loads = bounded(json.loads)


def _tool_input(raw: Any) -> Any:
    try:
        value = _loads(raw)
    except (TypeError, ValueError):
        return {}
    except DecodeError as exc:  # dsh would send it; this serializer cannot follow it that deep
        raise WireError(f"tool-call arguments: {exc.message}") from None
    return value if isinstance(value, dict) else {}


def _replay_blocks(message: dict[str, Any], model: Any) -> list[dict[str, Any]] | None:
    """The replay signatures of an assistant message (dsh's ``validateReplay``);
    ``None`` when there are none or they do not fit (dsh then drops them)."""
    source = message.get("source") or {}
    state = source.get("replayState")
    if source.get("kind") != "model" or state is None:
        return None
    response = state.get("response") if isinstance(state, dict) else None
    if (not isinstance(response, dict) or response.get("kind") != "deepseek-messages" or response.get("version") != 1
            or response.get("model") != source.get("model")):
        return None
    blocks = state.get("blocks")
    content = message["content"]
    if not isinstance(blocks, (list, tuple)) or len(blocks) != len(content):
        return None
    out = []
    for block, own in zip(blocks, content):
        if (not isinstance(block, dict) or block.get("type") != own.get("type")
                or block.get("type") not in ("text", "reasoning", "tool-call")):
            return None
        if "signature" in block and (block["type"] != "reasoning" or type(block["signature"]) is not str):
            return None
        out.append(block)
    return out if response.get("model") == model else None


def _assistant(message: dict[str, Any], model: Any) -> list[dict[str, Any]]:
    replay = _replay_blocks(message, model)
    out: list[dict[str, Any]] = []
    for index, block in enumerate(message["content"]):
        kind = block.get("type")
        if kind == "text":
            if block["text"]:
                out.append({"type": "text", "text": block["text"]})
        elif kind == "reasoning":
            item = {"type": "thinking", "thinking": block["text"]}
            if replay is not None and "signature" in replay[index]:
                item["signature"] = replay[index]["signature"]
            out.append(item)
        elif kind == "tool-call":
            out.append({"type": "tool_use", "id": block["id"], "name": block["name"],
                        "input": _tool_input(block["arguments"])})
        else:
            raise WireError(f"DeepSeek Messages cannot represent assistant content {kind}")
    return out


def _input(blocks: list[Any]) -> list[dict[str, Any]]:
    out = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            if block["text"]:
                out.append({"type": "text", "text": block["text"]})
        elif kind in ("reasoning", "tool-call"):
            continue
        else:  # images travel as uploaded files or inline bytes: not in the log
            raise WireError(f"DeepSeek Messages request content {kind} is not rebuilt from the log")
    return out


def _offloaded(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "image" and block.get("offloaded") is True


def _placeholder(message: Any, block: dict[str, Any], image_path: ImagePath | None) -> dict[str, Any]:
    attachment = block.get("attachment")
    if not isinstance(attachment, dict) or type(attachment.get("attachmentId")) is not str:
        raise WireError(f"an offloaded image of message {message.get('id')!r} has no attachment id")
    if image_path is None:
        raise WireError("an offloaded image's placeholder names the path of its normalized copy, which the log "
                        "does not hold: pass image_path")
    path = image_path(attachment)
    if path is not None and attachment.get("mediaType") not in IMAGE_EXTENSIONS:
        raise WireError(f"an offloaded image of message {message.get('id')!r} has no supported mediaType")
    return {"type": "text", "text": offloaded_image_text(attachment, path)}


def _placeholders(history: list[Any], image_path: ImagePath | None) -> list[Any]:
    """dsh's ``projectOffloadedImages``: each offloaded image, in any message,
    replaced by its placeholder text."""
    return [message if not any(_offloaded(block) for block in message["content"]) else
            {**message, "content": [_placeholder(message, block, image_path) if _offloaded(block) else block
                                    for block in message["content"]]}
            for message in history]


def _conversation(history: list[Any], in_history: bool, model: Any) -> tuple[list[dict[str, Any]], str | None]:
    messages: list[dict[str, Any]] = []
    history_system: str | None = None
    updates: list[dict[str, Any]] = []

    def flush() -> None:
        if updates:
            if not messages or messages[-1]["role"] != "user":
                raise WireError("DeepSeek Messages cannot represent system update without a preceding user or "
                                "tool-result turn")
            messages.extend(updates)
            updates.clear()

    for message in history:
        role = message["role"]
        if role == "developer":
            # dsh's runtime projects tool changes against its live tool
            # registry before the adapter sees them; for the tool-registry
            # messages a resumed or migrated session logs it sent none (every
            # request captured here), so none is rebuilt.
            continue
        if any(block.get("type") in ("tool-addition", "tool-removal") for block in message["content"]):
            raise WireError("DeepSeek Messages cannot represent tool-change blocks outside developer messages")
        if role == "system":
            if any(block.get("type") != "text" for block in message["content"]):
                raise WireError("DeepSeek Messages cannot represent non-text system message")
            text = "".join(block["text"] for block in message["content"])
            if in_history and messages:
                if not text:
                    raise WireError("DeepSeek Messages cannot represent empty in-history system update")
                updates.append({"role": "system", "content": [{"type": "text", "text": text}]})
            else:
                history_system = text
            continue
        if role == "assistant":
            content = _assistant(message, model)
        elif role == "tool":
            content = [{"type": "tool_result", "tool_use_id": message["toolCallId"], "content": _input(message["content"])}]
            if "isError" in message:
                content[0]["is_error"] = message["isError"]
        else:
            content = _input(message["content"])
        if role in ("user", "assistant") and not content:
            continue
        if role == "assistant":
            flush()
        wire_role = "user" if role == "tool" else role
        if messages and messages[-1]["role"] == wire_role:
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": wire_role, "content": content})
    flush()
    return messages, history_system


def _order_tool_results(messages: list[dict[str, Any]]) -> None:
    pending: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            calls = [block["id"] for block in message["content"] if block["type"] == "tool_use"]
            pending = set(calls)
            if len(pending) != len(calls):
                raise WireError("DeepSeek Messages duplicate tool call id")
        elif message["role"] == "user":
            results = [block for block in message["content"] if block["type"] == "tool_result"]
            for result in results:
                if result["tool_use_id"] not in pending:
                    raise WireError("DeepSeek Messages tool result has no matching call")
                pending.discard(result["tool_use_id"])
            if pending:
                raise WireError("DeepSeek Messages tool calls need immediate results")
            message["content"] = results + [block for block in message["content"] if block["type"] != "tool_result"]
    if pending:
        raise WireError("DeepSeek Messages history ends with unresolved tools")


def messages_body(header: Any, context: Any, history: list[Any],
                  image_path: ImagePath | None = None) -> dict[str, Any]:
    """The Messages API body for a prefix whose folded request header is
    ``header``, latest ``request/context`` payload ``context`` and derived
    messages ``history``; ``image_path`` resolves offloaded images' paths
    as the runtime did (needed only when the history offloaded one)."""
    config = header["config"]
    model = config.get("model")
    in_history = isinstance(context, dict) and context.get("systemPromptUpdate") == "in-history"
    messages, history_system = _conversation(_placeholders(history, image_path), in_history, model)
    _order_tool_results(messages)
    effort = config.get("reasoningEffort", "high")
    if effort not in _EFFORTS:
        raise WireError(f"DeepSeek Messages does not support reasoning effort {effort}")
    body: dict[str, Any] = {"model": model, "stream": True, "messages": messages,
                            "max_tokens": config.get("maxTokens", DEFAULT_MAX_TOKENS),
                            "thinking": {"type": "disabled" if effort == "off" else "enabled"}}
    if effort != "off":
        body["output_config"] = {"effort": effort}
    if history_system:
        body["system"] = history_system
    if "temperature" in config:
        body["temperature"] = config["temperature"]
    if "stop" in config:
        body["stop_sequences"] = config["stop"]
    if "tools" in header:
        body["tools"] = [{"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"],
                          **({"defer_loading": True} if tool.get("deferLoading") is True else {})}
                         for tool in header["tools"]]
    return body
