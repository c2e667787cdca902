"""The fuzzer's inputs (:mod:`tests.fuzzing`): seed logs and their mutations.

The seeds are real logs (the conformance corpus, the v3/v4 fixtures dsh
wrote, simulated v0/v3/v4 sessions); an input is one of them mutated one
to three times: a byte changed, a JSON value replaced by one of another
type (or nested at the depth limit, or past it), a key dropped, an event's
type or payload swapped for another's, lines dropped, repeated, swapped,
joined, or taken from another session.
"""

from __future__ import annotations

import io
import json
import random
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import zstandard

from dsh_core.events import KNOWN_TYPES as V0_TYPES
from dsh_core.formats.v4.vocabulary import KNOWN_TYPES as V4_TYPES
from dsh_core.json_depth import MAX_DEPTH
from producers.simulator import SimulatorConfig, simulate_session
from tests.conftest import corpus_logs, expected_of

__all__ = ["Log", "mutated", "seed_logs", "source_of"]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_TYPES = sorted(V0_TYPES | V4_TYPES)
_ODD: list[typing.Any] = [
    None, True, False, 0, -1, 1.5, 2**53, 2**64, -(10**400), "", "\ud800", "x" * 300, "plugin", "model",
    [], {}, [1, [2]], {"kind": "plugin"}, {"type": {}}, {"op": "replace", "start": 0, "end": 1},
    [{"type": "text", "text": 1}], {"kind": "user"}, "tool-call", {"turn": 1, "step": 1}]


@dataclass(frozen=True)
class Log:
    """A seed log: where a reader would find it, and its lines (header first)."""

    name: str
    source: str
    lines: tuple[bytes, ...]


def _unzstd(path: Path) -> list[bytes]:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes()), read_across_frames=True) as raw:
        return raw.read().split(b"\n")[:-1]


def source_of(lines: list[bytes]) -> str:
    """A path of dsh's layout for the log (v3/v4 readers check the folder is the id)."""
    try:
        header = json.loads(lines[0])
        return f"/sessions/p/{header['id']}/session.v{header['version']}.jsonl" if header.get("version") else \
            f"/sessions/{header['id']}.jsonl"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "/sessions/fuzzed.jsonl"


@cache
def seed_logs() -> tuple[Log, ...]:
    """Every log the fuzzer mutates."""
    found = [(log.name, log.read_bytes().split(b"\n")[:-1]) for log in corpus_logs("dsh-real")[::4]
             if expected_of(log)["accepted"] and log.stat().st_size < 100_000]
    found += [(f"{path.parent.name}/{path.name}", _unzstd(path))
              for path in sorted([*FIXTURES.glob("dsh-0.1.5/*.v3.jsonl.zstd"), *FIXTURES.glob("dsh-0.2.1/*.v4.jsonl.zstd")])]
    config = SimulatorConfig(sessions=9, seed=7, min_turns=1, max_turns=3, big_result_probability=0, formats=(0, 3, 4))
    for index in range(config.sessions):
        _, batches = simulate_session(config, index)
        records = [record for batch in batches for record in batch]
        found.append((f"simulated-{index}-v{config.formats[index % 3]}", [record.value for record in records]))
    return tuple(Log(name, source_of(lines), tuple(lines)) for name, lines in found)


# ------------------------------------------------------------------ mutations


def _paths(value: typing.Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found += _paths(item, path + (key,))
    return found


def _put(value: typing.Any, path: tuple, new: typing.Any) -> typing.Any:
    if not path:
        return new
    value[path[0]] = _put(value[path[0]], path[1:], new)
    return value


def _json_line(rng: random.Random, lines: list[bytes], change: typing.Callable[[typing.Any], typing.Any]) -> None:
    """Decode a random line, change its value, put it back (a line that is no JSON stays)."""
    index = rng.randrange(len(lines))
    try:
        value = json.loads(lines[index])
    except ValueError:
        return
    try:
        lines[index] = json.dumps(change(value)).encode()
    except RecursionError:  # nested past what Python's json writes (two deep values, one in the other): not kept
        pass


def _odd_value(rng: random.Random, lines: list[bytes]) -> typing.Any:
    kind = rng.randrange(4)
    if kind == 0:  # at the limit as a line counts it, or past it
        depth = rng.choice([MAX_DEPTH - 4, MAX_DEPTH - 1, MAX_DEPTH, 500])
        return json.loads("[" * depth + "]" * depth)
    if kind == 1:  # a value from elsewhere in the log: another field's shape
        try:
            other = json.loads(rng.choice(lines))
        except ValueError:
            return None
        return _at(other, rng.choice(_paths(other)))
    return rng.choice(_ODD)


def _path(rng: random.Random, value: typing.Any) -> tuple:
    paths = _paths(value)
    shallow = [path for path in paths if len(path) <= 3]  # data.header.tools, data.message.content, ...
    return rng.choice(shallow if rng.randrange(2) else paths)


def _at(value: typing.Any, path: tuple) -> typing.Any:
    for part in path:
        value = value[part]
    return value


def _mutate_once(rng: random.Random, lines: list[bytes], others: tuple[Log, ...]) -> None:
    kind = rng.randrange(11)
    index = rng.randrange(len(lines))
    line = lines[index]
    if kind == 0 and line:  # a byte changed, added or lost
        at = rng.randrange(len(line))
        lines[index] = line[:at] + bytes([rng.randrange(256)]) * rng.randrange(2) + line[at + rng.randrange(2):]
    elif kind in (1, 2, 3):  # a value of another type anywhere, as often in an event's own fields as below them
        _json_line(rng, lines, lambda v: _put(v, _path(rng, v), _odd_value(rng, lines)))
    elif kind == 4:  # a key dropped
        def drop(value: typing.Any) -> typing.Any:
            objects = [path for path in _paths(value) if isinstance(_at(value, path), dict) and _at(value, path)]
            if objects:
                target = _at(value, rng.choice(objects))
                del target[rng.choice(list(target))]
            return value
        _json_line(rng, lines, drop)
    elif kind == 5:  # another event type over this payload
        _json_line(rng, lines, lambda v: v | {"type": rng.choice(_TYPES)} if isinstance(v, dict) else v)
    elif kind == 6:  # another event's payload under this type
        try:
            data = json.loads(rng.choice(lines)).get("data")
        except (ValueError, AttributeError):
            return
        _json_line(rng, lines, lambda v: v | {"data": data} if isinstance(v, dict) else v)
    elif kind == 7 and len(lines) > 1:
        del lines[index]
    elif kind == 8:
        lines.insert(index, line)
    elif kind == 9:
        other = rng.randrange(len(lines))
        lines[index], lines[other] = lines[other], line
    elif kind == 10:  # a line of another session (a second writer's), or two lines joined
        if rng.randrange(2):
            lines.insert(index, rng.choice(rng.choice(others).lines[1:] or (b"{}",)))
        elif index + 1 < len(lines):
            lines[index:index + 2] = [line + lines[index + 1]]


def mutated(rng: random.Random) -> tuple[str, list[bytes]]:
    """A seed log, mutated one to three times: (its source path, its lines)."""
    logs = seed_logs()
    log = rng.choice(logs)
    lines = list(log.lines)
    for _ in range(rng.randint(1, 3)):
        _mutate_once(rng, lines, logs)
    return log.source, lines
