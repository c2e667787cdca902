"""The provider-neutral form of a model request, its digest and its parts.

The gateway normalizes each request body as it goes on the wire; the
auditor normalizes the body it rebuilds from the log prefix
(:func:`dsh_core.chat_wire.chat_completions_body` for v0,
:func:`dsh_core.formats.v4.wire.messages_body` for v4) the same way, so equal
digests mean the model saw exactly what the log holds. The form
(``dsh-request/1``, defined for other tools in docs/concepts/request-digest.md)::

    {"model": ..., "maxTokens": ..., "effort": ..., "temperature": ...,
     "stop": ...,                       # null when the wire has none
     "system": [text, ...],             # the system texts, in order
     "tools": [{"name", "description", "parameters"}, ...],
     "messages": [entry, ...]}

A message entry has ``role`` (``user``, ``assistant``, ``system`` or
``tool``) and only its non-empty fields among ``text`` (text parts, in
order; empty ones dropped), ``reasoning`` (likewise), ``toolCalls`` (``{id, name,
arguments}``; arguments as a JSON value, parsed from chat completions'
text when it parses), ``toolCallId`` and ``isError`` (a tool result) and
``other`` (any content block of another type, verbatim). A Messages user
message carrying tool results becomes one ``tool`` entry per result and a
``user`` entry for its other blocks, in block order; leading chat
``system`` messages are the system texts. Transport fields (``stream``,
``stream_options``, ``metadata``, dsh's ``dsh_session_log`` and
``dsh_plugin_packages``) are not part of it.

The digest is the SHA-256 of the form's RFC 8785 canonical JSON. The
parts (:func:`request_parts`) carry the settings verbatim and a short
digest of every other piece, so a mismatch can be located (which message,
which field) without the content travelling.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from .errors import DecodeError
from .json_depth import bounded
from .jsonvalue import canonical_json, sha256_jcs

__all__ = ["ALGORITHM", "KINDS", "RAW_ALGORITHM", "WIRES", "Wire", "classify", "differences", "normalize", "request_parts",
           "wire_digest"]

#: The ``algorithm`` of a gateway attestation.
ALGORITHM = "sha256-jcs-request/1"
#: The ``algorithm`` of an attestation of a request too large for the gateway
#: to read: hex SHA-256 of the body's bytes as they passed, not comparable
#: with a log's request.
RAW_ALGORITHM = "sha256-raw-body"
Wire = Literal["chat-completions", "messages"]
WIRES: tuple[Wire, ...] = ("chat-completions", "messages")
#: What a request is: an agent step (a request boundary of the log) or one of
#: the auxiliary requests dsh makes beside the steps (docs/formats/v4.md §8).
KINDS = ("agent", "title", "compaction")
_TITLE_PROMPT = "Create a concise title"
_COMPACTION_PROMPT = "You are now acting as a compaction engine"
_SETTINGS = ("model", "maxTokens", "effort", "temperature", "stop")
_PART_HEX = 16  # 64 bits: enough to tell which piece differs


class _Entry(dict[str, Any]):
    """One normalized message; empty fields are dropped by :meth:`done`."""

    def __init__(self, role: str | None) -> None:
        super().__init__(role=role, text=[], reasoning=[], toolCalls=[], other=[])

    def done(self) -> dict[str, Any]:
        for key in ("text", "reasoning"):
            self[key] = [part for part in self[key] if part != ""]
        return {key: value for key, value in self.items() if value not in ([], "", None, False)}


def _texts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return content
    return [] if content is None else [{"type": "unknown", "value": content}]


_loads = bounded(json.loads)


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return _loads(text)
    except (ValueError, DecodeError):  # not JSON, or nested too deeply: the text it is
        return text


def _messages_entries(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    entries: list[dict[str, Any]] = []
    current = _Entry(role)
    for block in _texts(message.get("content")):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(block, str):
            current["text"].append(block)
        elif kind == "text":
            current["text"].append(block.get("text"))
        elif kind == "thinking":
            current["reasoning"].append(block.get("thinking"))
        elif kind == "tool_use":
            current["toolCalls"].append({"id": block.get("id"), "name": block.get("name"),
                                         "arguments": block.get("input")})
        elif kind == "tool_result":
            if current.done() != {"role": role}:
                entries.append(current.done())
                current = _Entry(role)
            result = _Entry("tool")
            result.update(toolCallId=block.get("tool_use_id"), isError=block.get("is_error") is True)
            result["text"] = [part.get("text") if isinstance(part, dict) and part.get("type") == "text" else part
                              for part in _texts(block.get("content"))]
            entries.append(result.done())
        elif kind not in ("redacted_thinking",):
            current["other"].append(block)
    if current.done() != {"role": role} or not entries:
        entries.append(current.done())
    return entries


def _chat_entry(message: dict[str, Any]) -> dict[str, Any]:
    entry = _Entry(message.get("role"))
    for part in _texts(message.get("content")):
        if isinstance(part, str):
            entry["text"].append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            entry["text"].append(part.get("text"))
        else:
            entry["other"].append(part)
    if message.get("reasoning_content"):
        entry["reasoning"].append(message["reasoning_content"])
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        entry["toolCalls"].append({"id": call.get("id"), "name": function.get("name"),
                                   "arguments": _arguments(function.get("arguments"))})
    if message.get("role") == "tool":
        entry["toolCallId"] = message.get("tool_call_id")
    return entry.done()


def normalize(wire: Wire, body: dict[str, Any]) -> dict[str, Any]:
    """The ``dsh-request/1`` form of a request body sent on ``wire``."""
    if wire == "messages":
        thinking = body.get("thinking") or {}
        effort = "off" if thinking.get("type") == "disabled" else (body.get("output_config") or {}).get("effort")
        system = [part.get("text") if isinstance(part, dict) else part for part in _texts(body.get("system"))]
        tools = [{"name": tool.get("name"), "description": tool.get("description"),
                  "parameters": tool.get("input_schema")} for tool in body.get("tools") or []]
        messages = [entry for message in body.get("messages") or [] for entry in _messages_entries(message)]
        stop = body.get("stop_sequences")
    else:
        effort = body.get("reasoning_effort")
        listed = list(body.get("messages") or [])
        system = []
        while listed and listed[0].get("role") == "system":
            system.extend(part.get("text") if isinstance(part, dict) else part
                          for part in _texts(listed.pop(0).get("content")))
        tools = [{"name": (tool.get("function") or {}).get("name"),
                  "description": (tool.get("function") or {}).get("description"),
                  "parameters": (tool.get("function") or {}).get("parameters")} for tool in body.get("tools") or []]
        messages = [_chat_entry(message) for message in listed]
        stop = body.get("stop")
    return {"model": body.get("model"), "maxTokens": body.get("max_tokens"), "effort": effort,
            "temperature": body.get("temperature"), "stop": stop, "system": system, "tools": tools,
            "messages": messages}


def classify(normalized: dict[str, Any], compact_header: bool = False) -> str:
    """One of :data:`KINDS`: a session-title request has a system text
    starting "Create a concise title"; a compaction request carries dsh's
    ``x-deepseek-harness-compact: 1`` header (``compact_header``) or ends
    with a user text starting "You are now acting as a compaction engine"."""
    if normalized["system"] and str(normalized["system"][0]).startswith(_TITLE_PROMPT):
        return "title"
    users = [entry for entry in normalized["messages"] if entry["role"] == "user"]
    if compact_header or (users and any(str(text).startswith(_COMPACTION_PROMPT) for text in users[-1].get("text", []))):
        return "compaction"
    return "agent"


def wire_digest(normalized: dict[str, Any]) -> str:
    """Hex SHA-256 of the canonical JSON of a normalized request."""
    return sha256_jcs(normalized)


def _short(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()[:_PART_HEX]


def request_parts(normalized: dict[str, Any]) -> dict[str, Any]:
    """The settings verbatim, and a short digest of the system text, of each
    tool (by name) and of each field of each message."""
    return {"settings": {key: normalized[key] for key in _SETTINGS},
            "system": _short(normalized["system"]),
            "tools": [[tool.get("name"), _short(tool)] for tool in normalized["tools"]],
            "messages": [{key: (value if key == "role" else _short(value)) for key, value in entry.items()}
                         for entry in normalized["messages"]]}


def differences(sent: dict[str, Any], logged: dict[str, Any]) -> str:
    """What the request sent holds that the one rebuilt from the log does
    not, named by field and message (both :func:`request_parts`)."""
    found = []
    for key in _SETTINGS:
        if sent["settings"].get(key) != logged["settings"].get(key):
            found.append(f"{key}: sent {json.dumps(sent['settings'].get(key))}, "
                         f"logged {json.dumps(logged['settings'].get(key))}")
    if sent["system"] != logged["system"]:
        found.append("the system text differs")
    sent_tools, logged_tools = dict(map(tuple, sent["tools"])), dict(map(tuple, logged["tools"]))
    for name in sent_tools.keys() | logged_tools.keys():
        if name not in logged_tools:
            found.append(f"tool {name!r} was sent, the log has no such tool")
        elif name not in sent_tools:
            found.append(f"tool {name!r} is in the log, it was not sent")
        elif sent_tools[name] != logged_tools[name]:
            found.append(f"tool {name!r} differs")
    for index, (mine, theirs) in enumerate(zip(sent["messages"], logged["messages"])):
        if mine != theirs:
            fields = sorted(key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
            found.append(f"message {index} ({mine.get('role')}) differs in {', '.join(fields)}")
            break
    extra = len(sent["messages"]) - len(logged["messages"])
    if extra > 0:
        found.append(f"{extra} message(s) sent after the log's {len(logged['messages'])}, the first "
                     f"({sent['messages'][len(logged['messages'])].get('role')}) at index {len(logged['messages'])}")
    elif extra < 0:
        found.append(f"the log holds {-extra} message(s) more than were sent")
    return "; ".join(found) or "the digests differ"
