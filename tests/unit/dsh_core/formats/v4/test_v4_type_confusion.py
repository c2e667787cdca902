"""Any JSON value anywhere in a real v3 or v4 log is refused by name, never a crash.

Each case takes a log a real runtime wrote (``tests/fixtures``), puts one
value of another type (or a retired/plugin shape) at one random place in
one event, and loads it: the load either accepts or refuses with a
:class:`~dsh_core.errors.DshError`; no other exception may escape.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any, Iterator

import pytest
import zstandard

from dsh_core.storage.framing import compress_frame
from dsh_core.loader import load_session_bytes

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
LOGS = sorted([*FIXTURES.glob("dsh-0.2.1/*.v4.jsonl.zstd"), *FIXTURES.glob("dsh-0.1.5/*.v3.jsonl.zstd")])
VALUES = [None, True, 0, -1, 2**60, 1.5, "", "x", [], {}, [1, [2, 3]], {"a": 1}, "plugin", {"kind": "plugin"},
          {"op": "replace", "start": 0, "end": 1}]
CASES_PER_LOG = 150


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, path + (key,))


def _put(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _put(value[path[0]], path[1:], new)
    return value


@pytest.mark.parametrize("log", LOGS, ids=lambda log: f"{log.parent.name}/{log.name.split('.v')[0]}")
def test_one_value_of_another_type_anywhere_is_refused_by_name(log):
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(log.read_bytes()), read_across_frames=True) as raw:
        header, *lines = raw.read().decode().splitlines()
    parsed = json.loads(header)
    source = f"/sessions/p/{parsed['id']}/session.v{parsed['version']}.jsonl.zstd"
    rng = random.Random(log.name)
    outcomes = set()
    for _ in range(CASES_PER_LOG):
        events = [json.loads(line) for line in lines]
        index = rng.randrange(len(events))
        events[index] = _put(events[index], rng.choice(list(_paths(events[index]))), rng.choice(VALUES))
        data = compress_frame(header.encode() + b"\n") + compress_frame(
            "".join(json.dumps(event) + "\n" for event in events).encode())
        result = load_session_bytes(data, source=source, compression="zstd")  # raises nothing but DshError
        outcomes.add(result.error.category if result.error else "accepted")
    assert outcomes - {"accepted"}, "no case was refused: the mutations did nothing"
