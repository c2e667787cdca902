"""The Messages API body of a v4 history is the same whether the history is
given as plain JSON values or as the log's frozen ones."""

from __future__ import annotations

from dsh_core.jsonvalue import freeze
from dsh_core.formats.v4.wire import messages_body

HEADER = {"config": {"provider": "deepseek", "model": "m", "reasoningEffort": "high"},
          "tools": [{"name": "ls", "description": "List files", "parameters": {"type": "object"}}]}
SOURCE = {"kind": "model", "provider": "deepseek", "model": "m",
          "replayState": {"response": {"kind": "deepseek-messages", "version": 1, "model": "m"},
                          "blocks": [{"type": "reasoning", "signature": "sig-1"}, {"type": "text"}]}}
HISTORY = [
    {"id": "u1", "role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": "Hi"}]},
    {"id": "a1", "role": "assistant", "source": SOURCE,
     "content": [{"type": "reasoning", "text": "Say hello."}, {"type": "text", "text": "Hello"}]},
]


def test_the_thinking_signature_is_replayed_from_plain_and_frozen_values_alike():
    plain = messages_body(HEADER, None, HISTORY)
    assert plain["messages"][1]["content"][0] == {"type": "thinking", "thinking": "Say hello.", "signature": "sig-1"}
    assert messages_body(freeze(HEADER), None, freeze(HISTORY)) == plain
