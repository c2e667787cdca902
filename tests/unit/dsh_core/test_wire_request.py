"""The provider-neutral request form: the same conversation on either wire
normalizes alike; classification; differences named by field and message."""

from __future__ import annotations

from dsh_core.wire_request import classify, differences, normalize, request_parts, wire_digest

TOOLS = [{"name": "bash", "description": "Run a command", "parameters": {"type": "object"}}]

CHAT = {"model": "m", "max_tokens": 100, "reasoning_effort": "high", "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "List files"},
                     {"role": "assistant", "content": "", "reasoning_content": "Use ls.",
                      "tool_calls": [{"id": "c1", "type": "function",
                                      "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                     {"role": "user", "content": "Thanks"}],
        "tools": [{"type": "function", "function": TOOLS[0]}]}

MESSAGES = {"model": "m", "max_tokens": 100, "stream": True, "thinking": {"type": "enabled"},
            "output_config": {"effort": "high"}, "system": "Be brief.", "dsh_session_log": {"events": []},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "List files"}]},
                         {"role": "assistant", "content": [
                             {"type": "thinking", "thinking": "Use ls.", "signature": "sig"},
                             {"type": "tool_use", "id": "c1", "name": "bash", "input": {"command": "ls"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "a.txt"}]},
                             {"type": "text", "text": "Thanks"}]}],
            "tools": [{"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}}]}


def test_one_conversation_on_either_wire_has_one_digest():
    chat, messages = normalize("chat-completions", CHAT), normalize("messages", MESSAGES)
    assert chat == messages
    assert chat["messages"] == [
        {"role": "user", "text": ["List files"]},
        {"role": "assistant", "reasoning": ["Use ls."],
         "toolCalls": [{"id": "c1", "name": "bash", "arguments": {"command": "ls"}}]},
        {"role": "tool", "text": ["a.txt"], "toolCallId": "c1"},
        {"role": "user", "text": ["Thanks"]}]
    assert wire_digest(chat) == wire_digest(messages)
    assert classify(chat) == "agent"


def test_titles_and_compactions_are_classified():
    title = normalize("messages", {**MESSAGES, "system": "Create a concise title for this conversation."})
    assert classify(title) == "title"
    compaction = normalize("messages", {**MESSAGES, "messages": MESSAGES["messages"] + [
        {"role": "user", "content": [{"type": "text", "text": "You are now acting as a compaction engine. ..."}]}]})
    assert classify(compaction) == "compaction"
    assert classify(normalize("messages", MESSAGES), compact_header=True) == "compaction"


def test_differences_name_the_setting_the_field_and_the_message():
    logged = request_parts(normalize("messages", MESSAGES))

    def sent(**changes) -> dict:
        return request_parts(normalize("messages", {**MESSAGES, **changes}))

    assert differences(logged, logged) == "the digests differ"
    assert differences(sent(model="other"), logged) == 'model: sent "other", logged "m"'
    assert differences(sent(system="Be brief. Also obey the hidden rule."), logged) == "the system text differs"
    extra = MESSAGES["messages"] + [{"role": "user", "content": [{"type": "text", "text": "injected"}]}]
    assert differences(sent(messages=extra), logged) == (
        "1 message(s) sent after the log's 4, the first (user) at index 4")
    changed = [*MESSAGES["messages"][:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "b.txt"}]},
        {"type": "text", "text": "Thanks"}]}]
    assert differences(sent(messages=changed), logged) == "message 2 (tool) differs in text"
    assert differences(sent(tools=[]), logged) == "tool 'bash' is in the log, it was not sent"
