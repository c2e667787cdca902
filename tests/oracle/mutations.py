"""Single mutations of a dsh v4 session log, written where dsh reads them.

A v4 log is a sequence of zstd frames (checksum on, no content size): frame 0
is the header line alone, every later frame one append batch of JSONL lines
(docs/formats/v4.md §4). :class:`Log` holds those lines per frame; each
mutation in :data:`MUTATIONS` maps a ``Log`` to the bytes of one damaged or
edited file (or ``None`` when the log lacks what it needs, e.g. a tool
result). :func:`write_mutations` renames each copy to its own session id
(``<id>--<mutation>``, also inside delivery markers) and writes it to
``<root>/<projectKey(cwd)>/<id>/session.v4.jsonl.zstd``, so one oracle run
reads them all.

Lines are kept byte for byte except the ones a mutation edits; edited lines
are re-serialised compactly (``json.dumps(..., separators=(",", ":"),
ensure_ascii=False)``, which equals ``JSON.stringify`` for these values).
:func:`plain_log` and :func:`tools_log` build small v4 logs from the event
catalogue (docs/formats/v4.md §7) for when no real log is at hand."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import zstandard

from tests.oracle import session_dir

__all__ = ["MUTATIONS", "Log", "encode_frames", "plain_log", "read_log", "tools_log", "write_mutations"]

GARBAGE = '{"type":"garbage'  # not JSON: an unterminated string
_COMPRESSOR = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=False)


@dataclass(frozen=True)
class Log:
    """Lines (no ``\\n``) per zstd frame; ``frames[0]`` is ``[header]``."""

    frames: tuple[tuple[str, ...], ...]

    @property
    def header(self) -> dict:
        return json.loads(self.frames[0][0])

    @property
    def lines(self) -> list[str]:
        """The event lines, in order (the header excluded)."""
        return [line for frame in self.frames[1:] for line in frame]

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]

    def with_lines(self, lines: list[str]) -> Log:
        """The same frame boundaries (by line count) over new event lines;
        extra lines join the last frame, missing ones shorten it."""
        frames: list[tuple[str, ...]] = [self.frames[0]]
        at = 0
        body = self.frames[1:]
        for number, frame in enumerate(body):
            take = len(lines) - at if number == len(body) - 1 else min(len(frame), len(lines) - at)
            if take > 0:
                frames.append(tuple(lines[at:at + take]))
            at += max(take, 0)
        return Log(tuple(frames))

    def with_header(self, line: str) -> Log:
        return Log(((line,), *self.frames[1:]))

    def encode(self) -> bytes:
        return encode_frames(self.frames)


def encode_frames(frames: tuple[tuple[str, ...], ...] | list) -> bytes:
    return b"".join(_frame(lines) for lines in frames)


def _frame(lines: tuple[str, ...] | list[str]) -> bytes:
    return _COMPRESSOR.compress("".join(line + "\n" for line in lines).encode())


def read_log(path: Path) -> Log:
    """Split a clean ``session.v4.jsonl.zstd`` into its frames' lines."""
    data = path.read_bytes()
    frames = []
    while data:
        decoder = zstandard.ZstdDecompressor().decompressobj()
        text = decoder.decompress(data).decode()
        if not decoder.eof:
            raise ValueError(f"{path}: last zstd frame is incomplete")
        if not text.endswith("\n"):
            raise ValueError(f"{path}: frame {len(frames)} does not end on a newline")
        frames.append(tuple(text[:-1].split("\n")))
        data = decoder.unused_data
    return Log(tuple(frames))


def _dump(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# -- building blocks -------------------------------------------------------

def _index(log: Log, predicate: Callable[[dict], bool], last: bool = False) -> int | None:
    events = log.events()
    hits = [i for i, event in enumerate(events) if predicate(event)]
    return (hits[-1] if last else hits[0]) if hits else None


def _edit(log: Log, index: int | None, change: Callable[[dict], dict]) -> Log | None:
    if index is None:
        return None
    lines = log.lines
    lines[index] = _dump(change(json.loads(lines[index])))
    return log.with_lines(lines)


def _header_edit(change: Callable[[dict], object]) -> Callable[[Log], bytes]:
    def mutate(log: Log) -> bytes:
        return log.with_header(_dump(change(dict(log.header)))).encode()
    return mutate


def _append_frame(log: Log, *lines: str) -> bytes:
    return log.encode() + _frame(list(lines))


def _body(log: Log) -> list[tuple[str, ...]]:
    return list(log.frames[1:])


def _torn(plaintext_lines: list[str]) -> bytes:
    """A complete frame minus its 4-byte checksum: every block present, the
    frame unfinished (what a crash after the last block write leaves)."""
    return _frame(plaintext_lines)[:-4]


def _merged_tail(log: Log) -> tuple[bytes, list[str]]:
    """Encoded frames before the last two body frames, and those two frames'
    lines merged (so a torn tail frame has enough lines to work with)."""
    body = _body(log)
    keep = Log((log.frames[0], *body[:-2]))
    return keep.encode(), [line for frame in body[-2:] for line in frame]


def _is_turn_end(line: str) -> bool:
    return json.loads(line).get("type") == "turn/end"


def _first_surface(log: Log, kind: str, last: bool = False) -> int | None:
    return _index(log, lambda e: e.get("type") == kind and "surfaceOp" in e, last)


# -- framing mutations ---------------------------------------------------

def _torn_tail(log: Log) -> bytes:
    last = _frame(_body(log)[-1])
    return Log(log.frames[:-1]).encode() + last[: len(last) // 2]


def _torn_tail_4bytes(log: Log) -> bytes:
    return Log(log.frames[:-1]).encode() + _torn(list(_body(log)[-1]))


def _drop_last_line(log: Log) -> bytes:
    return log.with_lines(log.lines[:-1]).encode()


def _drop_last_frame(log: Log) -> bytes | None:
    return Log(log.frames[:-1]).encode() if len(log.frames) > 2 else None


def _torn_frame_garbage(log: Log) -> bytes | None:
    """Torn last frame: good lines, garbage, one more good line (no turn/end)."""
    head, lines = _merged_tail(log)
    lines = [line for line in lines if not _is_turn_end(line)]
    if len(lines) < 2:
        return None
    return head + _torn([*lines[:-1], GARBAGE, lines[-1]])


def _torn_frame_garbage_then_turn_end(log: Log) -> bytes | None:
    """Torn last frame: good lines, garbage, then the closing turn/end."""
    head, lines = _merged_tail(log)
    if len(lines) < 2 or not _is_turn_end(lines[-1]):
        return None
    return head + _torn([*lines[:-1], GARBAGE, lines[-1]])


def _garbage_middle_line(log: Log) -> bytes:
    lines = log.lines
    lines[len(lines) // 2] = GARBAGE
    return log.with_lines(lines).encode()


def _garbage_last_line(log: Log) -> bytes:
    lines = log.lines
    lines[-1] = GARBAGE
    return log.with_lines(lines).encode()


def _seq_gap_middle(log: Log) -> bytes:
    lines = log.lines
    del lines[len(lines) // 2]
    return log.with_lines(lines).encode()


def _seq_gap_tail(log: Log) -> bytes:
    lines = log.lines
    del lines[-2]
    return log.with_lines(lines).encode()


def _duplicate_line(log: Log) -> bytes:
    lines = log.lines
    middle = len(lines) // 2
    lines.insert(middle + 1, lines[middle])
    return log.with_lines(lines).encode()


def _duplicate_frame(log: Log) -> bytes:
    return _append_frame(log, *_body(log)[-1])


def _bad_checksum(log: Log) -> bytes:
    """Flip one bit of the checksum of the middle body frame."""
    frames = [_frame(lines) for lines in log.frames]
    middle = 1 + (len(frames) - 1) // 2
    damaged = bytearray(frames[middle])
    damaged[-1] ^= 0x01
    frames[middle] = bytes(damaged)
    return b"".join(frames)


def _trailing_garbage(log: Log) -> bytes:
    return log.encode() + b"garbage\n"


def _no_header(log: Log) -> bytes:
    return encode_frames(log.frames[1:])


def _header_two_lines(log: Log) -> bytes:
    body = _body(log)
    return encode_frames([(log.frames[0][0], body[0][0]), *([body[0][1:]] if len(body[0]) > 1 else []), *body[1:]])


def _one_frame(log: Log) -> bytes:
    return encode_frames([log.frames[0], tuple(log.lines)])


# -- envelope and vocabulary mutations -------------------------------------

def _appended_event(log: Log, **extra: object) -> bytes:
    events = log.events()
    event = {"type": "future/thing", "seq": len(events), "time": events[-1]["time"], "data": {"note": "from a newer harness"}, **extra}
    return _append_frame(log, _dump(event))


def _extra_envelope_key(log: Log) -> bytes:
    lines = log.lines
    middle = len(lines) // 2
    lines[middle] = lines[middle][:-1] + ',"extra":1}'
    return log.with_lines(lines).encode()


def _v0_replace_op(log: Log) -> bytes | None:
    """A replace surfaceOp in v0 spelling ``{op,start,end}``; when the log has
    no replacement, the last user/message replaces the surface node before it."""
    events = log.events()
    index = _index(log, lambda e: isinstance(e.get("surfaceOp"), dict))
    if index is not None:
        op = events[index]["surfaceOp"]
        return _edit(log, index, lambda e: {**e, "surfaceOp": {"op": "replace", "start": op["startSeq"], "end": op["endSeq"]}}).encode()
    index = _first_surface(log, "user/message", last=True)
    earlier = [e["seq"] for e in events[:index] if "surfaceOp" in e] if index is not None else []
    if not earlier:
        return None
    target = earlier[-1]
    return _edit(log, index, lambda e: {**e, "surfaceOp": {"op": "replace", "start": target, "end": target}, "sourceEventSeqs": [target]}).encode()


def _v0_tool_result_shape(log: Log) -> bytes | None:
    """The first tool/result with v0's message: role user, one tool-result block."""
    def v0(event: dict) -> dict:
        message = event["data"]["message"]
        block = {"type": "tool-result", "toolCallId": message["toolCallId"], "content": message["content"],
                 **({"isError": message["isError"]} if "isError" in message else {})}
        old = {"source": message["source"], "content": [block], "role": "user", "id": message["id"]}
        return {**event, "data": {**event["data"], "message": old}}
    edited = _edit(log, _first_surface(log, "tool/result"), v0)
    return edited.encode() if edited else None


def _replace_forward(log: Log) -> bytes | None:
    """A user/message whose replace names itself and the event after it."""
    index = _first_surface(log, "user/message")
    if index is None:
        return None
    seq = log.events()[index]["seq"]
    return _edit(log, index, lambda e: {**e, "surfaceOp": {"op": "replace", "startSeq": seq + 1, "endSeq": seq + 1}}).encode()


def _appended_replace(log: Log, target: Callable[[list[dict]], tuple[int, int] | None], cite: bool = True) -> bytes | None:
    """Append a user/message that replaces the surface range ``target(events)``
    names, citing the shadowed surface nodes in ``sourceEventSeqs`` when ``cite``."""
    events = log.events()
    span = target(events)
    if span is None:
        return None
    start, end = span
    shadowed = [e["seq"] for e in events if "surfaceOp" in e and start <= e["seq"] <= end]
    message = {"id": "replacement-1", "role": "user", "content": [{"type": "text", "text": "Summary of the earlier conversation."}],
               "source": {"kind": "user"}}
    event = {"type": "user/message", "seq": len(events), "time": events[-1]["time"], "data": message,
             "surfaceOp": {"op": "replace", "startSeq": start, "endSeq": end}}
    if cite and shadowed:
        event["sourceEventSeqs"] = shadowed
    return _append_frame(log, _dump(event))


def _after_system(events: list[dict]) -> tuple[int, int] | None:
    """From the first user/message node to the last surface node."""
    users = [e["seq"] for e in events if e["type"] == "user/message" and "surfaceOp" in e]
    nodes = [e["seq"] for e in events if "surfaceOp" in e]
    return (users[0], nodes[-1]) if users else None


def _non_surface(events: list[dict]) -> tuple[int, int] | None:
    plain = [e["seq"] for e in events if e["type"] == "turn/start"]
    return (plain[0], plain[0]) if plain else None


def _system_head(events: list[dict]) -> tuple[int, int] | None:
    nodes = [e["seq"] for e in events if e["type"] == "system/message" and "surfaceOp" in e]
    return (nodes[0], nodes[0]) if nodes else None


def _sources_on(kind: str, value: Callable[[int], object]) -> Callable[[Log], bytes | None]:
    """Set ``sourceEventSeqs`` (computed from the event's own seq) on the first
    surface event of ``kind``."""
    def mutate(log: Log) -> bytes | None:
        index = _first_surface(log, kind)
        if index is None:
            return None
        return _edit(log, index, lambda e: {**e, "sourceEventSeqs": value(e["seq"])}).encode()
    return mutate


MUTATIONS: dict[str, Callable[[Log], bytes | None]] = {
    "control": Log.encode,
    # framing (docs/formats/v4.md §4)
    "torn_tail": _torn_tail,
    "torn_tail_4bytes": _torn_tail_4bytes,
    "drop_last_line": _drop_last_line,
    "drop_last_frame": _drop_last_frame,
    "torn_frame_garbage": _torn_frame_garbage,
    "torn_frame_garbage_then_turn_end": _torn_frame_garbage_then_turn_end,
    "garbage_middle_line": _garbage_middle_line,
    "garbage_last_line": _garbage_last_line,
    "seq_gap_middle": _seq_gap_middle,
    "seq_gap_tail": _seq_gap_tail,
    "duplicate_line": _duplicate_line,
    "duplicate_frame": _duplicate_frame,
    "bad_checksum": _bad_checksum,
    "trailing_garbage": _trailing_garbage,
    "one_frame": _one_frame,
    # header (docs/formats/v4.md §5)
    "header_version_5": _header_edit(lambda h: {**h, "version": 5}),
    "header_version_3": _header_edit(lambda h: {**h, "version": 3}),
    "header_version_0": _header_edit(lambda h: {**h, "version": 0}),
    "header_version_string": _header_edit(lambda h: {**h, "version": "4"}),
    "header_extra_field": _header_edit(lambda h: {**h, "seedLength": 0}),
    "header_missing_isSeeded": _header_edit(lambda h: {k: v for k, v in h.items() if k != "isSeeded"}),
    "header_missing_delegationDepth": _header_edit(lambda h: {k: v for k, v in h.items() if k != "delegationDepth"}),
    "header_not_object": _header_edit(lambda h: "42"),
    "header_wrong_id": _header_edit(lambda h: {**h, "id": h["id"] + "-other"}),
    "no_header": _no_header,
    "header_two_lines": _header_two_lines,
    # envelope and vocabulary (docs/formats/v4.md §6, §9b)
    "unknown_type": lambda log: _appended_event(log),
    "unknown_type_ignorable": lambda log: _appended_event(log, ignorable=True),
    "extra_envelope_key": _extra_envelope_key,
    "v0_replace_op": _v0_replace_op,
    "v0_tool_result_shape": _v0_tool_result_shape,
    "replace_forward": _replace_forward,
    # replacements folded by the surface (docs/formats/v4.md §6): valid, uncited, off-surface, over the system head
    "replace_tail_valid": lambda log: _appended_replace(log, _after_system),
    "replace_tail_uncited": lambda log: _appended_replace(log, _after_system, cite=False),
    "replace_non_surface": lambda log: _appended_replace(log, _non_surface),
    "replace_system_head_by_user": lambda log: _appended_replace(log, _system_head),
    # sourceEventSeqs (docs/formats/v4.md §6): on assistant/message, and range encodings on a user/message
    "sources_on_assistant_message": _sources_on("assistant/message", lambda s: [s - 1]),
    "sources_on_user_message": _sources_on("user/message", lambda s: [0]),
    "sources_range": _sources_on("user/message", lambda s: [[0, s - 1]]),
    "sources_range_pair": _sources_on("user/message", lambda s: [[0, 1]]),
    "sources_range_mixed": _sources_on("user/message", lambda s: [0, [1, s - 1]]),
    "sources_range_reversed": _sources_on("user/message", lambda s: [[s - 1, 0]]),
    "sources_range_to_self": _sources_on("user/message", lambda s: [[0, s]]),
    "sources_range_forward": _sources_on("user/message", lambda s: [[0, s + 3]]),
    "sources_range_overlap": _sources_on("user/message", lambda s: [[0, 2], [1, 3]]),
    "sources_range_triple": _sources_on("user/message", lambda s: [[0, 1, 2]]),
    "sources_range_unsorted": _sources_on("user/message", lambda s: [s - 1, [0, 2]]),
    "sources_plain_unsorted": _sources_on("user/message", lambda s: [s - 1, 0, 1]),
    "sources_plain_duplicate": _sources_on("user/message", lambda s: [0, 0]),
    "sources_empty": _sources_on("user/message", lambda s: []),
    "sources_range_on_tool_result": _sources_on("tool/result", lambda s: [[0, s - 1]]),
}


def write_mutations(source: Log | Path, root: Path, names: list[str] | None = None,
                    file_name: str = "session.v4.jsonl.zstd",
                    table: Mapping[str, Callable[[Log], bytes | None]] = MUTATIONS) -> dict[str, str]:
    """Write each applicable mutation of ``source`` (from ``table``) as its own
    session under ``root``; return ``{mutation: session id}`` (inapplicable
    ones left out)."""
    log = read_log(source) if isinstance(source, Path) else source
    header = log.header
    original = header["id"]
    written: dict[str, str] = {}
    for name in names or list(table):
        new_id = f"{original}--{name}"
        renamed = _renamed(log, original, new_id)
        data = table[name](renamed)
        if data is None:
            continue
        target = session_dir(root, header.get("cwd"), new_id)
        target.mkdir(parents=True, exist_ok=True)
        (target / file_name).write_bytes(data)
        written[name] = new_id
    return written


def _renamed(log: Log, old: str, new: str) -> Log:
    """The log under a new session id: the header, and every JSON string equal
    to the old id (delivery markers' ``sessionId``)."""
    quoted_old, quoted_new = _dump(old), _dump(new)
    return Log(tuple(tuple(line.replace(quoted_old, quoted_new) for line in frame) for frame in log.frames))


# -- hand-built logs from the event catalogue (docs/formats/v4.md §7) -------------------------

_CWD = "/tmp/dsh-oracle/workspace"
_MODEL = {"provider": "deepseek-official", "model": "deepseek-v4-flash"}
_TOOL = {"name": "bash", "description": "Execute a bash command.",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                        "required": ["command", "description"]}}


class _Builder:
    def __init__(self, session_id: str, created_at: int) -> None:
        self.header = {"type": "session", "version": 4, "id": session_id, "createdAt": created_at,
                       "cwd": _CWD, "isSeeded": False, "delegationDepth": 0}
        self.time = created_at
        self.frames: list[list[str]] = [[_dump(self.header)]]
        self.seq = 0

    def frame(self) -> None:
        self.frames.append([])

    def add(self, kind: str, data: dict, **envelope: object) -> int:
        self.time += 3
        event = {"type": kind, "seq": self.seq, "time": self.time, "data": data, **envelope}
        self.frames[-1].append(_dump(event))
        self.seq += 1
        return event["seq"]

    def assistant(self, turn: int, step: int, number: int, blocks: list[dict], finish: str) -> int:
        stream: list[dict] = []
        t = self.time
        for index, block in enumerate(blocks):
            stream.append({"type": "chunk", "time": t, "chunk": {"type": "block-start", "index": index, "blockType": block["type"]}})
            if block["type"] == "tool-call":
                stream.append({"type": "tool-call-chunks", "time0": t, "index": index, "dt": [], "id": block["id"], "name": block["name"], "args": [""]})
                stream.append({"type": "tool-call-chunks", "time0": t + 1, "index": index, "dt": [], "id": block["id"], "args": [block["arguments"]]})
            else:
                kind = "reasoning-chunks" if block["type"] == "reasoning" else "text-chunks"
                stream.append({"type": kind, "time0": t, "index": index, "dt": [], "texts": [block["text"]]})
        for index, block in enumerate(blocks):
            stream.append({"type": "chunk", "time": t + 2, "chunk": {"type": "block-end", "index": index, "block": block}})
        usage = {"inputTokens": 70, "outputTokens": 20, "cacheReadTokens": 30, "cacheWriteTokens": 0, "totalTokens": 120}
        stream.append({"type": "chunk", "time": t + 2, "chunk": {"type": "usage", "usage": usage}})
        stream.append({"type": "chunk", "time": t + 2, "chunk": {"type": "finish", "reason": {"kind": finish}}})
        message = {"id": f"assistant-{number}", "role": "assistant", "content": blocks, "source": {"kind": "model", **_MODEL}}
        return self.add("assistant/message", {"turn": turn, "step": step, "message": message, "stream": stream, "usage": usage}, surfaceOp="append")

    def log(self) -> Log:
        return Log(tuple(tuple(frame) for frame in self.frames if frame))


def _opening(b: _Builder, prompt: str) -> None:
    b.frame()
    b.add("permission/preset", {"preset": "danger-full-access"})
    b.add("sandbox/mode", {"mode": "danger-full-access"})
    b.add("approval/policy", {"policy": "never"})
    b.frame()
    b.add("turn/start", {"turn": 1})
    b.add("step/start", {"turn": 1, "step": 1})
    b.add("system/message", {"turn": 1, "step": 1, "message": {"id": "system-1", "role": "system", "source": {"kind": "system-prompt"},
                                                              "content": [{"type": "text", "text": "You are a test agent."}]}}, surfaceOp="append")
    b.add("user/message", {"id": "user-1", "role": "user", "content": [{"type": "text", "text": prompt}], "source": {"kind": "user"}}, surfaceOp="append")
    b.add("request/header", {"header": {"config": {**_MODEL, "maxTokens": 256000, "reasoningEffort": "high"},
                                        "adapterDefaults": {"reasoningEffort": True, "maxTokens": True}, "tools": [_TOOL]},
                             "reason": "initial"})
    b.add("request/context", {**_MODEL, "contextWindow": 1000000})


def plain_log(session_id: str = "session-hand-plain", created_at: int = 1_800_000_000_000) -> Log:
    """One turn, one step, a text answer: header, permission/preset,
    sandbox/mode, approval/policy, turn/start, step/start, system/message,
    user/message, request/header, request/context, assistant/message,
    step/end, turn/end, in four batches."""
    b = _Builder(session_id, created_at)
    _opening(b, "please answer")
    b.frame()
    b.assistant(1, 1, 1, [{"type": "reasoning", "text": "Greet."}, {"type": "text", "text": "Hello."}], "stop")
    b.frame()
    b.add("step/end", {"turn": 1, "step": 1})
    b.add("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    return b.log()


def tools_log(session_id: str = "session-hand-tools", created_at: int = 1_800_000_100_000) -> Log:
    """As :func:`plain_log`, but step 1 calls bash (tool/call, then a
    tool/result citing its call) and step 2 answers."""
    b = _Builder(session_id, created_at)
    _opening(b, "run a command")
    b.frame()
    call = {"type": "tool-call", "id": "call_1", "name": "bash", "arguments": '{"command":"echo OK","description":"echo"}'}
    b.assistant(1, 1, 1, [{"type": "text", "text": "Let me run it."}, call], "tool-calls")
    call_seq = b.add("tool/call", {"turn": 1, "step": 1, "callId": "call_1", "name": "bash", "arguments": call["arguments"]})
    b.frame()
    b.add("tool/result", {"turn": 1, "step": 1, "message": {"id": "tool-1", "role": "tool", "source": {"kind": "tool", "callId": "call_1"},
                                                            "toolCallId": "call_1", "content": [{"type": "text", "text": "OK\n[exit code: 0]"}],
                                                            "isError": False}},
          surfaceOp="append", sourceEventSeqs=[call_seq])
    b.add("step/end", {"turn": 1, "step": 1})
    b.frame()
    b.add("step/start", {"turn": 1, "step": 2})
    b.assistant(1, 2, 2, [{"type": "text", "text": "It printed OK."}], "stop")
    b.frame()
    b.add("step/end", {"turn": 1, "step": 2})
    b.add("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    return b.log()
