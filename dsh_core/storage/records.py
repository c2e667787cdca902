"""Storage records (docs/formats/v0.md §8.3): one JSONL line is an event or a packed chunk row.

A row packs a run of ≥ 3 same-block delta chunks into one line. Decoding
validates a row-tagged line strictly (any failure is a malformed row);
every other line value passes through as one event, unvalidated here.
Encoding re-packs exactly as dsh does, so encode(decode(x)) reproduces dsh's
bytes for any batch dsh wrote.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Annotated, Any, Iterable, NamedTuple, TypeGuard, Union

import msgspec

from ..errors import DecodeError
from ..json_depth import bounded
from ..jsonvalue import MAX_SAFE_INTEGER, encode_json, float_hook, is_safe_int

__all__ = ["ChunkRow", "MIN_RUN", "decode_row", "decode_row_line", "pack_chunk_runs", "encode_records", "DELTA_TYPE"]

#: Minimum members before a run packs (a format constant of dsh).
MIN_RUN = 3

#: Row tag → the chunk type its members expand to.
DELTA_TYPE = {"text-chunks": "text-delta", "reasoning-chunks": "reasoning-delta", "tool-call-chunks": "tool-call-delta"}
_ROW_OF_DELTA = {v: k for k, v in DELTA_TYPE.items()}

_STR = {str}
_INT = {int}
_ROW_KEYS = frozenset({"type", "seq0", "time0", "data"})
_TEXT_KEYS = frozenset({"turn", "step", "index", "dt", "texts"})
_TOOL_KEYS = frozenset({"turn", "step", "index", "id", "dt", "args"})
_TOOL_KEYS_NAMED = _TOOL_KEYS | {"name"}


def _number(value: Any) -> TypeGuard[int | float]:
    return type(value) is int or type(value) is float


class ChunkRow(NamedTuple):
    """A decoded, validated packed row; :meth:`expand` yields its events."""

    tag: str
    seq0: int
    time0: int
    turn: Any
    step: Any
    index: Any
    dt: list[int]
    members: list[str]
    call_id: str | None
    name: str | None
    has_name: bool
    last_time: int

    @property
    def event_count(self) -> int:
        """The events the row packs (``count`` would hide the tuple's own method)."""
        return len(self.members)

    def expand(self) -> list[dict[str, Any]]:
        """The exact original ``assistant/chunk`` events, in order."""
        events = []
        time = self.time0
        delta = DELTA_TYPE[self.tag]
        for k, member in enumerate(self.members):
            if k:
                time += self.dt[k - 1]
            if self.tag == "tool-call-chunks":
                chunk: dict[str, Any] = {"type": delta, "index": self.index, "id": self.call_id}
                if self.has_name:
                    chunk["name"] = self.name
                chunk["argumentsDelta"] = member
            else:
                chunk = {"type": delta, "index": self.index, "text": member}
            events.append({"type": "assistant/chunk", "seq": self.seq0 + k, "time": time,
                           "data": {"turn": self.turn, "step": self.step, "chunk": chunk}})
        return events


def decode_row(value: dict[str, Any]) -> ChunkRow:
    """Validate a row-tagged line value (docs/formats/v0.md §8.3 Decode); raises
    :class:`DecodeError` naming what is malformed."""
    tag = value["type"]

    def malformed(why: str) -> DecodeError:
        return DecodeError(f"malformed {tag} storage row: {why}")

    if value.keys() != _ROW_KEYS:
        raise malformed("envelope must be exactly {type, seq0, time0, data}")
    seq0, time0, data = value["seq0"], value["time0"], value["data"]
    if not is_safe_int(seq0) or seq0 < 0:
        raise malformed("seq0 must be a non-negative safe integer")
    if not is_safe_int(time0):
        raise malformed("time0 must be a safe integer")
    if not isinstance(data, dict):
        raise malformed("data must be an object")
    call_id = name = None
    has_name = False
    if tag == "tool-call-chunks":
        keys = data.keys()
        has_name = keys == _TOOL_KEYS_NAMED
        if not has_name and keys != _TOOL_KEYS:
            raise malformed("data must be exactly {turn, step, index, id, name?, dt, args}")
        call_id, name = data["id"], data.get("name")
        if type(call_id) is not str or (has_name and type(name) is not str):
            raise malformed("id (and name when present) must be strings")
        members = data["args"]
        member_key = "args"
    else:
        if data.keys() != _TEXT_KEYS:
            raise malformed("data must be exactly {turn, step, index, dt, texts}")
        members = data["texts"]
        member_key = "texts"
    turn, step, index = data["turn"], data["step"], data["index"]
    if not (_number(turn) and _number(step) and _number(index)):
        raise malformed("turn/step/index must be numbers")
    if type(members) is not list or not members or set(map(type, members)) != _STR:
        raise malformed(f"{member_key} must be a non-empty string array")
    dt = data["dt"]
    if type(dt) is not list or (dt and (set(map(type, dt)) != _INT or min(dt) < -MAX_SAFE_INTEGER
                                        or max(dt) > MAX_SAFE_INTEGER)):
        raise malformed("dt must be an array of safe integers")
    if len(dt) != len(members) - 1:
        raise malformed(f"dt length {len(dt)} does not match {len(members)} members")
    if seq0 + len(members) - 1 > MAX_SAFE_INTEGER:
        raise malformed("member seqs must stay safe integers")
    times = list(accumulate(dt, initial=time0))
    if min(times) < -MAX_SAFE_INTEGER or max(times) > MAX_SAFE_INTEGER:
        raise malformed("member times must stay safe integers")
    return ChunkRow(tag, seq0, time0, turn, step, index, dt, members, call_id, name, has_name, times[-1])


# A well-formed row line, checked by msgspec in one pass. It accepts a subset
# of what decode_row accepts (numbers written as 1.0, integers beyond 64 bits
# and lone surrogates take the generic path), and builds the same ChunkRow.
_SafeInt = Annotated[int, msgspec.Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
_Members = Annotated[list[str], msgspec.Meta(min_length=1)]


class _TextData(msgspec.Struct, forbid_unknown_fields=True):
    turn: Any
    step: Any
    index: Any
    dt: list[_SafeInt]
    texts: _Members


class _ToolData(msgspec.Struct, forbid_unknown_fields=True):
    turn: Any
    step: Any
    index: Any
    id: str
    dt: list[_SafeInt]
    args: _Members
    name: str | msgspec.UnsetType = msgspec.UNSET


class _Row(msgspec.Struct, forbid_unknown_fields=True, tag_field="type"):
    seq0: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INTEGER)]
    time0: _SafeInt


class _TextRow(_Row, tag="text-chunks"):
    data: _TextData


class _ReasoningRow(_Row, tag="reasoning-chunks"):
    data: _TextData


class _ToolRow(_Row, tag="tool-call-chunks"):
    data: _ToolData


_decode_row_struct = bounded(msgspec.json.Decoder(Union[_TextRow, _ReasoningRow, _ToolRow], float_hook=float_hook).decode)


def decode_row_line(line: bytes) -> ChunkRow | None:
    """The row of a well-formed row line, or ``None`` for any other line
    (which :func:`decode_row` then decodes or refuses by name)."""
    try:
        row = _decode_row_struct(line)
    except (msgspec.DecodeError, msgspec.ValidationError, DecodeError):
        return None
    data = row.data
    if not (_number(data.turn) and _number(data.step) and _number(data.index)):
        return None
    if isinstance(data, _ToolData):
        name = data.name if isinstance(data.name, str) else None
        members, call_id, has_name = data.args, data.id, name is not None
    else:
        members, call_id, name, has_name = data.texts, None, None, False
    dt = data.dt
    if len(dt) != len(members) - 1 or row.seq0 + len(members) - 1 > MAX_SAFE_INTEGER:
        return None
    times = list(accumulate(dt, initial=row.time0))
    if min(times) < -MAX_SAFE_INTEGER or max(times) > MAX_SAFE_INTEGER:
        return None
    return ChunkRow(str(row.__struct_config__.tag), row.seq0, row.time0, data.turn, data.step, data.index, dt, members,
                    call_id, name, has_name, times[-1])


# ------------------------------------------------------------------ packing

_CHUNK_DATA_KEYS = frozenset({"turn", "step", "chunk"})
_EVENT_KEYS = frozenset({"type", "seq", "time", "data"})
_TEXT_CHUNK_KEYS = frozenset({"type", "index", "text"})
_TOOL_CHUNK_KEYS = frozenset({"type", "index", "id", "argumentsDelta"})
_TOOL_CHUNK_KEYS_NAMED = _TOOL_CHUNK_KEYS | {"name"}


def _delta_kind(event: dict[str, Any]) -> str | None:
    """The delta kind when the whole event shape is packable, else ``None``."""
    if event.get("type") != "assistant/chunk" or event.keys() != _EVENT_KEYS:
        return None
    seq, time = event["seq"], event["time"]
    if not is_safe_int(seq) or seq < 0 or not is_safe_int(time):
        return None
    data = event["data"]
    if not isinstance(data, dict) or data.keys() != _CHUNK_DATA_KEYS:
        return None
    if not _number(data["turn"]) or not _number(data["step"]):
        return None
    chunk = data["chunk"]
    if not isinstance(chunk, dict) or not _number(chunk.get("index")):
        return None
    kind = chunk.get("type")
    if kind in ("text-delta", "reasoning-delta"):
        return str(kind) if chunk.keys() == _TEXT_CHUNK_KEYS and type(chunk["text"]) is str else None
    if kind == "tool-call-delta":
        keys = chunk.keys()
        if keys == _TOOL_CHUNK_KEYS or (keys == _TOOL_CHUNK_KEYS_NAMED and type(chunk["name"]) is str):
            if type(chunk["id"]) is str and type(chunk["argumentsDelta"]) is str:
                return "tool-call-delta"
    return None


def _continues(prev: dict[str, Any], nxt: dict[str, Any], kind: str) -> bool:
    if nxt["seq"] != prev["seq"] + 1 or not is_safe_int(nxt["time"] - prev["time"]):
        return False
    pd, nd = prev["data"], nxt["data"]
    if nd["turn"] != pd["turn"] or nd["step"] != pd["step"] or nd["chunk"]["index"] != pd["chunk"]["index"]:
        return False
    if kind != "tool-call-delta":
        return True
    a, b = pd["chunk"], nd["chunk"]
    return a["id"] == b["id"] and ("name" in a) == ("name" in b) and a.get("name") == b.get("name")


def _build_row(kind: str, run: list[dict[str, Any]]) -> dict[str, Any]:
    first = run[0]
    fd = first["data"]
    data: dict[str, Any] = {
        "turn": fd["turn"], "step": fd["step"], "index": fd["chunk"]["index"],
        "dt": [run[i + 1]["time"] - run[i]["time"] for i in range(len(run) - 1)],
    }
    if kind == "tool-call-delta":
        data["id"] = fd["chunk"]["id"]
        if "name" in fd["chunk"]:
            data["name"] = fd["chunk"]["name"]
        data["args"] = [e["data"]["chunk"]["argumentsDelta"] for e in run]
    else:
        data["texts"] = [e["data"]["chunk"]["text"] for e in run]
    return {"type": _ROW_OF_DELTA[kind], "seq0": first["seq"], "time0": first["time"], "data": data}


def pack_chunk_runs(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Storage records of one append batch: runs of ≥ 3 packable same-block
    deltas become rows, everything else passes through verbatim, in order."""
    out: list[dict[str, Any]] = []
    kind: str | None = None
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if kind is not None and len(run) >= MIN_RUN:
            out.append(_build_row(kind, run))
        else:
            out.extend(run)

    for event in events:
        k = _delta_kind(event)
        if k is None:
            flush()
            kind, run = None, []
            out.append(event)
            continue
        if k == kind and run and _continues(run[-1], event, k):
            run.append(event)
            continue
        flush()
        kind, run = k, [event]
    flush()
    return out


def encode_records(events: Iterable[dict[str, Any]], pack: bool = True) -> bytes:
    """The JSONL text of one batch (each line ends in a newline)."""
    records = pack_chunk_runs(events) if pack else list(events)
    return b"".join(encode_json(record) + b"\n" for record in records)

