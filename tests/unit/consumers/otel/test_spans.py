"""The span mapping on the real corpus and the dsh 0.2.1 fixtures: the spans
each log gives, their nesting, ids and times, and the same spans when the
mapping stops anywhere and goes on from its saved state (what a restart of
the exporter does)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import zstandard
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv.schemas import Schemas

from consumers.otel import SCHEMA_URL, GenAISpan, SpanMapper
from consumers.otel.otlp import CHARS_PER_REQUEST, SPANS_PER_REQUEST, request_parts
from consumers.otel.event_fields import CONTENT_CHARS
from consumers.otel.spans import span_id, trace_id
from dsh_core.errors import PipelineError
from dsh_pipeline.otel_command import read_headers_file
from tests.conftest import ROOT, corpus_logs

LOGS = corpus_logs("dsh-real")
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "dsh-0.2.1").glob("*.v4.jsonl.zstd"))


def _lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    if path.suffix == ".zstd":
        data = zstandard.ZstdDecompressor().stream_reader(data).read()
    return data.splitlines()


def _session(path: Path) -> tuple[str, list[bytes]]:
    lines = _lines(path)
    return json.loads(lines[0])["id"], lines[1:]


def _spans(session_id: str, lines: list[bytes], content: bool = False) -> list[GenAISpan]:
    mapper = SpanMapper(session_id, content)
    return [span for line in lines for span in mapper.feed(line)]


def _in_order(lines: list[bytes]) -> bool:
    times = [json.loads(line).get("time") for line in lines]
    times = [time for time in times if type(time) is int]
    return times == sorted(times)


def _types(lines: list[bytes]) -> list[str]:
    return [json.loads(line).get("type") for line in lines]


@pytest.mark.parametrize("log", LOGS + FIXTURES, ids=lambda path: path.name)
def test_each_response_tool_call_and_turn_is_one_span_nested_in_its_turn(log):
    session_id, lines = _session(log)
    spans = _spans(session_id, lines)
    types = _types(lines)
    operations = [span.attributes["gen_ai.operation.name"] for span in spans]
    assert operations.count("chat") == types.count("assistant/message")
    assert operations.count("execute_tool") <= types.count("tool/call")
    assert operations.count("invoke_agent") <= types.count("turn/start")
    ids = [span.span_id for span in spans]
    assert len(ids) == len(set(ids)), "a span id is used twice"
    turns = {span.span_id: span for span in spans if span.attributes["gen_ai.operation.name"] == "invoke_agent"}
    for span in spans:
        assert span.trace_id == trace_id(session_id)
        assert span.start_ms <= span.end_ms
        assert span.attributes["gen_ai.conversation.id"] == span.attributes["session.id"] == session_id
        assert span.attributes["gen_ai.provider.name"] in ("deepseek", "fixture", "cli-mock")  # test providers
        assert span.span_id == span_id(session_id, span.attributes["dsh.seq"], span.attributes["gen_ai.operation.name"])
        if span.parent_id is not None:
            parent = turns[span.parent_id]
            if _in_order(lines):  # some restored recordings have times that go back
                assert parent.start_ms <= span.start_ms and span.end_ms <= parent.end_ms
        if span.attributes["gen_ai.operation.name"] == "chat":
            assert span.name == f"chat {span.attributes['gen_ai.request.model']}"


@pytest.mark.parametrize("log", LOGS[::6] + FIXTURES, ids=lambda path: path.name)
def test_a_mapping_stopped_anywhere_goes_on_from_its_saved_state_to_the_same_spans(log):
    session_id, lines = _session(log)
    whole = _spans(session_id, lines, content=True)
    for cut in range(0, len(lines) + 1, max(1, len(lines) // 7)):
        first = SpanMapper(session_id, True)
        spans = [span for line in lines[:cut] for span in first.feed(line)]
        then = SpanMapper(session_id, True, first.state())
        spans += [span for line in lines[cut:] for span in then.feed(line)]
        assert spans == whole, f"cut at line {cut}"


def test_a_tool_round_of_the_corpus_as_spans():
    session_id, lines = _session(ROOT / "tests/corpus/dsh-real/apps-web-tests-snapshots-cordis-tool-round.jsonl")
    spans = _spans(session_id, lines)
    assert [span.name for span in spans] == [
        "chat deepseek-v4-flash", "execute_tool cordis_inspect", "chat deepseek-v4-flash", "execute_tool cordis_mount",
        "chat deepseek-v4-flash", "execute_tool cordis_unmount", "chat deepseek-v4-flash", "invoke_agent dsh"]
    chat, tool, turn = spans[0], spans[1], spans[-1]
    assert (chat.kind, chat.start_ms, chat.end_ms) == ("client", 1785157562987, 1785157563192)  # step/start .. message
    assert chat.attributes == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "deepseek", "gen_ai.conversation.id": session_id,
        "session.id": session_id, "dsh.seq": 3, "dsh.step": 1, "gen_ai.request.model": "deepseek-v4-flash",
        "gen_ai.response.model": "deepseek-v4-flash", "gen_ai.usage.input_tokens": 15137,
        "gen_ai.usage.output_tokens": 128, "gen_ai.usage.cache_read.input_tokens": 1280,
        "gen_ai.response.finish_reasons": ["tool_call"], "gen_ai.response.time_to_first_chunk": 0.055}
    assert chat.parent_id == tool.parent_id == turn.span_id and turn.parent_id is None
    assert (tool.kind, tool.start_ms, tool.end_ms, tool.error) == ("internal", 1785157563196, 1785157563230, None)
    assert tool.attributes["gen_ai.tool.call.id"] == "call_00_KZk918WtlKan9pHMULIT8794"
    assert "gen_ai.tool.call.arguments" not in tool.attributes
    assert (turn.start_ms, turn.end_ms, turn.attributes["dsh.turn.end_reason"]) == (1785157562875, 1785157564128,
                                                                                    "completed")
    assert turn.attributes["gen_ai.usage.input_tokens"] == 15137 + 72 + 63 + 29


def test_content_is_sent_only_when_asked_for():
    session_id, lines = _session(ROOT / "tests/corpus/dsh-real/apps-web-tests-snapshots-cordis-tool-round.jsonl")
    assert not any(key.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.tool.call.a", "gen_ai.tool.call.r"))
                   for span in _spans(session_id, lines) for key in span.attributes)
    spans = _spans(session_id, lines, content=True)
    first, second = json.loads(spans[0].attributes["gen_ai.input.messages"]), \
        json.loads(spans[2].attributes["gen_ai.input.messages"])
    assert first[0]["role"] == "user" and first[0]["parts"][0]["type"] == "text"
    assert second == [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_00_KZk918WtlKan9pHMULIT8794",
                                                  "response": "## Temporary Plugins\nNo temporary Plugins are running. "
                                                  "Temporary Plugins created with cordis_mount disappear when DSH "
                                                  "restarts."}]}]
    output = json.loads(spans[0].attributes["gen_ai.output.messages"])
    assert output[0]["role"] == "assistant" and output[0]["finish_reason"] == "tool_call"
    assert [part["type"] for part in output[0]["parts"]] == ["reasoning", "tool_call"]
    assert spans[1].attributes["gen_ai.tool.call.arguments"] == '{"what": "temporary"}'


def test_a_v4_message_gives_its_finish_reason_and_first_chunk_from_its_stream():
    session_id, lines = _session(ROOT / "tests/fixtures/dsh-0.2.1/max-tokens.v4.jsonl.zstd")
    chat = next(span for span in _spans(session_id, lines) if span.name.startswith("chat"))
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert chat.attributes["gen_ai.request.model"] == "deepseek-flash"
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] >= 0


def test_every_attribute_is_one_of_the_pinned_conventions():
    """The names are those of the locked semantic-conventions package, whose
    schemas include the pinned version."""
    assert SCHEMA_URL in {schema.value for schema in Schemas}
    defined = {value for name, value in vars(gen_ai_attributes).items() if name.startswith("GEN_AI_")}
    used = {key for log in LOGS[::10] + FIXTURES for span in _spans(*_session(log), content=True)
            for key in span.attributes if key.startswith("gen_ai.")}
    assert used - defined == set()
    assert {"gen_ai.input.messages", "gen_ai.tool.call.result", "gen_ai.usage.output_tokens"} <= used


def test_the_headers_file_is_its_owners_alone_and_named_where_it_is_wrong(tmp_path):
    path = tmp_path / "headers"
    path.write_text("# the tenant's key\nauthorization = Bearer abc\nx-scope-orgid=team-a\n")
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    assert read_headers_file(str(path)).reveal() == "authorization=Bearer abc,x-scope-orgid=team-a"
    path.write_text("authorization Bearer abc\n")
    with pytest.raises(PipelineError, match=r"--otlp-headers-file .*headers, line 1: expected name=value"):
        read_headers_file(str(path))
    os.chmod(path, 0o644)
    with pytest.raises(PipelineError, match=r"its group or others may read or change it \(mode 0644\)"):
        read_headers_file(str(path))


def test_a_long_tool_output_is_cut_and_says_how_much():
    session_id = "otel-long"
    long = "x" * (CONTENT_CHARS + 10)
    lines = [json.dumps(event).encode() for event in (
        {"type": "turn/start", "seq": 0, "time": 1000, "data": {"turn": 1}},
        {"type": "tool/call", "seq": 1, "time": 1001, "data": {"turn": 1, "step": 1, "callId": "c", "name": "bash",
                                                               "arguments": "{}"}},
        {"type": "tool/result", "seq": 2, "time": 1002, "data": {"turn": 1, "step": 1, "callId": "c",
                                                                 "content": [{"type": "text", "text": long}],
                                                                 "isError": True}})]
    [tool] = _spans(session_id, lines, content=True)
    assert tool.attributes["gen_ai.tool.call.result"] == "x" * CONTENT_CHARS + "… [10 more characters not exported]"
    assert tool.error == "tool-error"


def test_spans_go_in_requests_bounded_in_count_and_text():
    def span(chars: int) -> GenAISpan:
        return GenAISpan(name="chat", kind="client", trace_id=1, span_id=1, parent_id=None, start_ms=0, end_ms=0,
                         attributes={"gen_ai.output.messages": "y" * chars})
    parts = request_parts([span(10)] * (SPANS_PER_REQUEST + 1) + [span(CHARS_PER_REQUEST)] * 2)
    assert [len(part) for part in parts] == [SPANS_PER_REQUEST, 1, 1, 1]
