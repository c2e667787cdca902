"""chat_completions_body on hand-made prefixes: the serializer rules of dsh
0.1.1rc1's DeepSeek adapter that the real agents do not all reach."""

from __future__ import annotations

import json

import pytest

from dsh_core.chat_wire import chat_completions_body
from dsh_core.errors import ValidationError
from dsh_core.jsonvalue import freeze

CONFIG = {"provider": "deepseek-official", "model": "deepseek-v4-flash"}
TOOL = {"name": "bash", "description": "Run a command.", "parameters": {"type": "object", "properties": {}}}


def _user(*blocks):
    return {"id": "u", "role": "user", "source": {"kind": "user"}, "content": list(blocks)}


def _text(text):
    return {"type": "text", "text": text}


def _result(call_id, *blocks):
    return {"type": "tool-result", "toolCallId": call_id, "content": list(blocks), "isError": False}


def test_a_tool_call_history_on_the_wire():
    history = [
        _user(_text("Look "), _text("around.")),
        {"id": "a", "role": "assistant", "source": {"kind": "model", "provider": "p", "model": "m"},
         "content": [{"type": "reasoning", "text": "List "}, _text("Listing."), {"type": "reasoning", "text": "it."},
                     {"type": "tool-call", "id": "c1", "name": "bash", "arguments": '{"command": "ls"}'},
                     {"type": "tool-call", "id": "c2", "name": "bash", "arguments": "{broken"}]},
        _user(_result("c1", _text("a.txt\n"))),
        _user(_text("and also"), _result("c2"), {"type": "plugin-note", "text": "not sent"}),
        {"id": "s", "role": "system", "source": {"kind": "plugin", "plugin": "x"}, "content": [_text("Be brief.")]},
    ]
    header = {"config": {**CONFIG, "reasoningEffort": "max", "maxTokens": 1000, "temperature": 0.5, "stop": ["END"]},
              "system": "You are dsh.", "tools": [TOOL]}
    body = chat_completions_body(freeze(header), freeze(history))
    assert body == {
        "model": "deepseek-v4-flash",
        "messages": [
            {"role": "system", "content": "You are dsh."},
            {"role": "user", "content": "Look around."},
            {"role": "assistant", "content": "Listing.", "reasoning_content": "List it.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
                {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": "{broken"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt\n"},
            {"role": "user", "content": "and also"},
            {"role": "tool", "tool_call_id": "c2", "content": "(no output)"},
            {"role": "system", "content": "Be brief."},
        ],
        "stream": True, "stream_options": {"include_usage": True},
        "thinking": {"type": "enabled"}, "reasoning_effort": "max",
        "tools": [{"type": "function", "function": TOOL}],
        "temperature": 0.5, "max_tokens": 1000, "stop": ["END"],
    }
    body["tools"][0]["function"]["parameters"]["extra"] = True  # plain JSON, the caller's own
    assert json.loads(json.dumps(body))["stop"] == ["END"]


def test_effort_off_disables_thinking_and_no_effort_sends_neither_field():
    history = [_user(_text("Hi"))]
    off = chat_completions_body({"config": {**CONFIG, "reasoningEffort": "off"}}, history)
    assert off == {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
                   "stream_options": {"include_usage": True}, "thinking": {"type": "disabled"}}
    unset = chat_completions_body({"config": CONFIG}, [_user()])
    assert unset["messages"] == [{"role": "user", "content": ""}]
    assert not {"thinking", "reasoning_effort", "tools", "max_tokens"} & set(unset)


def test_what_dsh_refuses_or_the_log_cannot_rebuild_is_named():
    with pytest.raises(ValidationError, match="reasoning effort 'medium'"):
        chat_completions_body({"config": {**CONFIG, "reasoningEffort": "medium"}}, [])
    image = {"type": "image", "attachment": {"attachmentId": "x", "mediaType": "image/png", "bytes": 3,
                                            "width": 1, "height": 1}}
    for message in (_user(_text("see"), image), _user(_result("c1", image))):
        with pytest.raises(ValidationError, match="message 0 .* holds an image"):
            chat_completions_body({"config": CONFIG}, [message])
