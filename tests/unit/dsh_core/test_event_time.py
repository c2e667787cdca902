"""Each format's event times, read from dsh's own logs (v0 0.1.1, v3 0.1.5,
v4 0.2.1) and from lines written here for each rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from dsh_core.event_time import LineTime, line_time

FIXTURES = Path(__file__).parents[2] / "fixtures"
LOGS = {"v0": "dsh-0.1.1/plain.jsonl.zstd", "v3": "dsh-0.1.5/plain.v3.jsonl.zstd", "v4": "dsh-0.2.1/plain.v4.jsonl.zstd"}


def _lines(name: str) -> list[bytes]:
    with (FIXTURES / name).open("rb") as file:
        return zstandard.ZstdDecompressor().stream_reader(file, read_across_frames=True).read().splitlines()


@pytest.mark.parametrize("version", sorted(LOGS))
def test_every_line_of_a_real_log_has_the_time_dsh_gave_it(version: str) -> None:
    lines = _lines(LOGS[version])
    header = json.loads(lines[0])
    assert line_time(lines[0]) == LineTime("session", header["createdAt"], header["createdAt"], None, None, None)
    for line in lines[1:]:
        event = json.loads(line)
        found = line_time(line)
        assert found is not None and found.type == event["type"]
        if "time0" in event:  # a packed chunk row: its members' times
            assert (found.first, found.last) == (event["time0"], event["time0"] + sum(event["data"]["dt"]))
        else:
            assert found.first == found.last == event["time"]
        data = event["data"] if isinstance(event["data"], dict) else {}
        assert (found.turn, found.step) == (data.get("turn"), data.get("step"))


@pytest.mark.parametrize("version", sorted(LOGS))
def test_a_model_output_begins_at_its_first_chunk(version: str) -> None:
    lines = [json.loads(line) for line in _lines(LOGS[version])[1:]]
    message = next(line for line in lines if line["type"] == "assistant/message")
    if version == "v0":  # chunks are events of their own, before the message
        first = next(line for line in lines if line["type"] in ("assistant/chunk", "reasoning-chunks"))
        assert line_time(json.dumps(first).encode()).output_at == first["time"]
        assert line_time(json.dumps(message).encode()).output_at is None
    else:  # the message keeps its stream
        stamp = message["data"]["stream"][0]
        assert line_time(json.dumps(message).encode()).output_at == stamp.get("time", stamp.get("time0"))
        assert stamp.get("time", stamp.get("time0")) < message["time"]


@pytest.mark.parametrize("line, expected", [
    (b'{"type":"turn/start","seq":0,"time":-5,"data":null}', LineTime("turn/start", -5, -5, None, None, None)),
    (b'{"type":"x","seq":0,"time":7,"data":{"turn":true,"step":"1"}}', LineTime("x", 7, 7, None, None, None)),
    (b'{"type":"text-chunks","seq0":3,"time0":10,"data":{"turn":1,"step":2,"dt":[5,-2],"texts":["a","b","c"]}}',
     LineTime("text-chunks", 10, 13, 1, 2, 10)),
    (b'{"type":"assistant/message","seq":4,"time":20,"data":{"turn":1,"step":1,"stream":[{"type":"text-chunks",'
     b'"time0":12,"dt":[]}]}}', LineTime("assistant/message", 20, 20, 1, 1, 12)),
])
def test_each_rule(line: bytes, expected: LineTime) -> None:
    assert line_time(line) == expected


@pytest.mark.parametrize("line", [b"not json", b"[1]", b'{"type":"x","seq":0}', b'{"type":"x","time":1.5}',
                                  b'{"type":"x","time":9007199254740992}', b'{"type":"session","createdAt":"1"}'])
def test_a_line_without_a_time_has_none(line: bytes) -> None:
    assert line_time(line) is None
