"""The scripted model finds a session's script tag in its requests."""

from __future__ import annotations

import pytest

from dsh_pipeline.scripted_chat import script_tag


def test_the_tag_is_taken_from_the_first_user_message_holding_one():
    # after a compaction the first user message is the checkpoint summary
    body = {"messages": [{"role": "system", "content": "[script:wrong#1]"},
                         {"role": "user", "content": "This is an automatically generated checkpoint ..."},
                         {"role": "user", "content": [{"type": "text", "text": "[script:compact#c1] go"}]},
                         {"role": "user", "content": "[script:later#2]"}]}
    assert script_tag(body) == ("compact", "c1")


def test_a_request_without_a_tag_is_refused():
    with pytest.raises(ValueError, match=r"no \[script:NAME#ID\] tag in any user message: hello"):
        script_tag({"messages": [{"role": "user", "content": "hello"}]})
