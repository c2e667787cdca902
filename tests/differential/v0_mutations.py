"""v0 sessions with one event's payload mutated, for the checks of dsh's migration chain.

The sources are the real v0 logs of the conformance corpus that stand alone
(no parent, no children), those whose first message comes inside a step
taken first (dsh's v2→v3 edge refuses a message before the first step, and
before it checks anything later in the log), and, for the event types and message sources no
real log holds, valid payloads built here: a log-level event appended after
a real log's last event, a message source put on a real ``user/message``
that no title cites. From each distinct event shape (its type, its message
source kind, an assistant chunk's block start or end) every
member path of its ``data`` is mutated one way at a time: a value of the
wrong JSON type, an object member removed, an unexpected member added, a
string that no enumeration holds, an empty string or array, a zero or
negative count, a flipped boolean. Each mutated log is its own session (the
id is the source's with a suffix), so all of them meet dsh's reader in one
sessions root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from tests.conftest import corpus_logs, expected_of
from tests.layout_helpers import place

__all__ = ["Mutation", "mutations", "write_mutations"]

_UNEXPECTED = "unexpectedMember"
_BAD_ENUM = "not-a-released-value"


class Mutation(NamedTuple):
    """One mutated session: its id, what was changed, and the raw log."""

    session_id: str
    event_type: str
    what: str
    log: bytes


def _base_logs() -> list[list[dict[str, Any]]]:
    """Standalone accepted v0 corpus logs, each as its header and event lines."""
    logs = []
    for log in corpus_logs("dsh-real"):
        want = expected_of(log)
        if want["accepted"]:
            logs.append([json.loads(line) for line in log.read_bytes().split(b"\n") if line.strip()])
    parents = {lines[0].get("parentSession") for lines in logs}
    return sorted((lines for lines in logs if "parentSession" not in lines[0] and lines[0]["id"] not in parents
                   and lines[0].get("version") == 0), key=lambda lines: (not _stepped(lines), len(lines)))


_SURFACE = frozenset({"user/message", "assistant/message", "tool/result"})


def _stepped(lines: list[dict[str, Any]]) -> bool:
    """Whether a step opens before the log's first message: dsh's v2→v3 edge
    refuses a message before the first step, and refuses it first, so only in
    such a log do the checks of every later event and edge meet a mutation."""
    types = [line.get("type") for line in lines]
    step = types.index("step/start") if "step/start" in types else len(types)
    return all(kind not in _SURFACE for kind in types[:step]) and step < len(types)


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


_GOAL = {"id": "goal-1", "revision": 1, "objective": "ship it", "phase": "blocked", "maxGoalRounds": 3,
         "blockedReason": {"code": "needs-input", "message": "waiting"}}
_GOAL_CHANGE = {"kind": "goal/change", "version": 1, "operation": "block", "goal": _GOAL, "roundsStarted": 1,
                "createdAt": 1, "updatedAt": 2}
_LEGACY_GOAL_PAYLOAD = {key: _GOAL_CHANGE[key] for key in ("goal", "roundsStarted", "createdAt", "updatedAt")}
_IMAGE = {"type": "image", "attachment": {"attachmentId": "att-1", "mediaType": "image/png", "bytes": 10, "width": 2,
                                          "height": 3, "name": "a.png",
                                          "originalDimensions": {"width": 4, "height": 6}}}

#: valid payloads of the types no real v0 log holds, appended after a log's last event.
LOG_EVENTS: dict[str, list[dict[str, Any]]] = {
    "agent-preset/selected": [{"agentPreset": "code"}],
    "feedback/record": [{"text": "good"}],
    "model/selection": [{"provider": "deepseek", "model": "deepseek-chat", "reasoningEffort": "high"}],
    "plan/mode": [{"active": True}],
    "schedule/change": [
        {"version": 1, "operation": "create", "schedule": {"id": "s1", "kind": "every", "prompt": "check",
                                                            "everySeconds": 600,
                                                            "scheduledAt": "2025-01-02T03:04:05.678Z"}},
        {"version": 1, "operation": "dispatch", "id": "s1", "acceptedAt": "2025-01-02T03:04:05.678Z"}],
    "subagent/model-selection-policy": [{"allowedModels": [{"provider": "deepseek", "model": "deepseek-chat"},
                                                           {"provider": "deepseek", "model": "deepseek-reasoner"}]}],
    "team/member": [{"version": 1, "teamId": "t1", "member": {"id": "m1", "name": "ann", "description": "d",
                                                              "provider": "deepseek", "context": "fresh",
                                                              "phase": "failed", "error": "boom"}}],
    "team/message/delivered": [{"version": 1, "teamId": "t1", "messageId": "x1", "targetId": "m1"}],
    "team/message/queued": [{"version": 1, "teamId": "t1", "message": {
        "id": "x1", "senderId": "m1", "senderName": "ann", "targetId": "m2", "delivery": "wakeup",
        "content": [*_text("hi"), _IMAGE]}}],
    "team/task": [{"version": 1, "teamId": "t1", "task": {"id": "k1", "revision": 2, "subject": "s",
                                                          "description": "d", "status": "in_progress",
                                                          "blockedBy": ["k0"], "writeScopes": ["src"],
                                                          "ownerId": "m1"}}],
    "web/deepseek-search-llm-request": [{"endpoint": "https://example.invalid/v1/messages", "apiVersion": "1",
                                         "body": {"model": "m", "max_tokens": 100,
                                                  "messages": [{"role": "user", "content": _text("q")}],
                                                  "tools": [{"type": "web_search_20250305", "name": "web_search",
                                                             "max_uses": 2}]}}],
    "goal/change": [{"kind": "goal/change", "version": 1, "operation": "clear",
                     "cleared": {"id": "goal-1", "revision": 2}, "clearedAt": 3}],
    "subagent/descriptor": [{"mode": "continuable", "version": 3, "provider": "deepseek", "label": "helper",
                             "agentProvider": "deepseek", "agentModel": "deepseek-chat", "persona": "p",
                             "toolFilter": {"allow": ["bash"], "deny": ["web"]}}],
    "llm/retry": [{"retryId": "r1", "turn": 1, "step": 1, "provider": "deepseek", "mode": "always",
                   "policyKey": "k", "retry": 2, "delayMs": 10.5,
                   "failure": {"message": "m", "code": "c", "status": 503, "providerRetryAfterMs": 5,
                               "requestId": "q"}}],
}

#: message sources no real v0 log holds, put on a real ``user/message`` (with its content).
SOURCES: list[tuple[dict[str, Any], list[dict[str, Any]] | None]] = [
    ({"kind": "session-reference", "form": "recall", "version": 1, "references": [
        {"sessionId": "s-a", "label": "a", "capturedThroughSeq": 4, "compacted": False, "originalMessages": 3,
         "retainedMessages": 2, "omittedMessages": 1, "omittedBytes": 0, "truncated": True, "inputIndex": 0},
        {"sessionId": "s-b", "label": "b", "capturedThroughSeq": None, "compacted": True, "originalMessages": 1,
         "retainedMessages": 1, "omittedMessages": 0, "omittedBytes": 0, "truncated": False, "inputIndex": 1}]},
     None),
    ({"kind": "team-message", "teamId": "t1", "messageId": "x1", "senderId": "m1", "senderName": "ann"}, None),
    ({"kind": "skill-invocation", "name": "review", "form": "instructions"}, None),
    ({"kind": "webhook", "provider": "github", "source": "repo", "deliveryId": "d1", "ruleId": "r1",
      "form": "notice", "summary": "pushed"}, None),
    ({"kind": "user", "rpcId": "rpc-1", "clientTimeZone": "UTC"}, [*_text("look"), _IMAGE]),
    ({"kind": "agent-message", "form": "relay", "senderSessionId": "s-c"},
     [*_text("relayed"), {"type": "file", "attachment": {"attachmentId": "att-2", "name": "notes.txt", "bytes": 12}}]),
    ({"kind": "goal", "goalId": "goal-1", "revision": 1, "round": 0, "change": _GOAL_CHANGE},
     _text(f"<goal_state>{json.dumps(_LEGACY_GOAL_PAYLOAD, separators=(',', ':'))}</goal_state>")),
]


def _shape(event: dict[str, Any]) -> tuple[Any, ...]:
    data = event.get("data")
    if not isinstance(data, dict):
        return (event.get("type"),)
    message = data if event["type"] == "user/message" else data.get("message")
    source = message.get("source") if isinstance(message, dict) else None
    kind = (source.get("kind"), source.get("form"), "change" in source) if isinstance(source, dict) else None
    reason = data.get("reason") if event["type"] == "turn/end" else None
    chunk = data.get("chunk") if event["type"] == "assistant/chunk" else None
    return (event["type"], kind, reason.get("kind") if isinstance(reason, dict) else None,
            data.get("operation"), data.get("mode"), chunk.get("type") if isinstance(chunk, dict) else None)


#: members dsh keeps as opaque JSON: mutated whole, never inside.
_OPAQUE = frozenset({"parameters", "replayState", "meta", "arguments"})


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if path and path[-1] in _OPAQUE:
        return
    if isinstance(value, dict):
        for key, member in value.items():
            yield from _paths(member, (*path, key))
    elif isinstance(value, list):
        for index, member in enumerate(value[:2]):  # the first two members stand for the rest
            yield from _paths(member, (*path, index))


def _variants(value: Any) -> list[tuple[str, Any]]:
    """The replacements of one value: ``(what, new value)``; ``...`` removes it."""
    if isinstance(value, dict):
        return [("not an object", []), ("unexpected member", {**value, _UNEXPECTED: 1})]
    if isinstance(value, list):
        return [("not an array", {}), ("empty array", [])]
    if type(value) is bool:
        return [("not a boolean", "true"), ("flipped boolean", not value)]
    if type(value) in (int, float):
        return [("not a number", str(value)), ("negative", -1), ("zero", 0)]
    if type(value) is str:
        return [("not a string", 7), ("not an enumerated value", _BAD_ENUM), ("empty string", "")]
    return [("not null", "x")]


def _set(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``data`` with the member at ``path`` replaced (``...``: removed)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        copy = dict(data)
        if value is ... and not rest:
            del copy[head]
        else:
            copy[head] = _set(data[head], rest, value)
        return copy
    copy = list(data)
    copy[head] = _set(data[head], rest, value)
    return copy


def _pattern(path: tuple[Any, ...]) -> str:
    return ".".join("[]" if isinstance(part, int) else part for part in path)


#: types whose checks take another shape with their ``operation`` or ``mode``.
_VARIANT_TYPES = frozenset({"goal/change", "schedule/change", "subagent/descriptor", "llm/retry"})


def _payload_mutations(event: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], str, dict[str, Any]]]:
    """Every single-path mutation of a payload (nested member types, removals,
    additions and values), with the key that tells it from the same mutation of
    another event: the path pattern, and the event's shape where the path runs
    through a part whose checks depend on it (a source, a turn-end reason)."""
    data = event["data"]
    for path, value in _paths(data):
        if not path:
            continue
        where = _pattern(path)
        shaped = "source" in path or path[0] in ("reason", "chunk") or event["type"] in _VARIANT_TYPES
        key = (event["type"], _shape(event) if shaped else None, where)
        for what, replacement in _variants(value):
            yield key, f"{where}: {what}", _set(data, path, replacement)
        if isinstance(value, dict):
            for member in value:
                yield key, f"{where}: without {member}", _set(data, (*path, member), ...)


def _renamed(lines: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    return [{**lines[0], "id": f"{lines[0]['id']}-{suffix}"}, *lines[1:]]


def _through_turn(lines: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The log up to the end of the turn holding line ``index`` (all of it if that turn never ends)."""
    end = next((i for i in range(index, len(lines)) if lines[i].get("type") == "turn/end"), len(lines) - 1)
    return lines[:end + 1]


def _titled(lines: list[dict[str, Any]], event: dict[str, Any]) -> bool:
    """Whether a session title cites ``event`` (so it must stay a human's message)."""
    return any(line.get("type") == "session/title" and event["seq"] in line["data"].get("messageSeqs", [])
               for line in lines)


def _sources(bases: list[list[dict[str, Any]]]) -> Iterator[tuple[list[dict[str, Any]], int]]:
    """Each base event to mutate, once per distinct shape, in the first log
    that holds it (:func:`_base_logs` order), cut after its turn: (log lines,
    line index)."""
    seen: set[tuple[Any, ...]] = set()
    for lines in bases:
        for index, event in enumerate(lines[1:], start=1):
            shape = _shape(event)
            if event.get("type") not in ("text-chunks", "reasoning-chunks", "tool-call-chunks") \
                    and shape[-1] in (None, "block-start", "block-end") and shape not in seen:
                seen.add(shape)
                yield _through_turn(lines, index), index
    plain, user = next((lines, index) for lines in bases if lines[-1].get("type") == "turn/end"
                       for index, event in enumerate(lines) if event.get("type") == "user/message"
                       and event["data"].get("source", {}).get("kind") == "user" and not _titled(lines, event))
    for source, content in SOURCES:
        data = {**plain[user]["data"], "source": source, **({"content": content} if content else {})}
        yield [*plain[:user], {**plain[user], "data": data}, *plain[user + 1:]], user
    last = plain[-1]
    for event_type, payloads in LOG_EVENTS.items():
        for data in payloads:
            event = {"type": event_type, "seq": last["seq"] + 1, "time": last["time"], "data": data}
            yield [*plain, event], len(plain)


def mutations() -> list[Mutation]:
    """The controls (each source unmutated) and every mutation, deduplicated by
    event shape and member path pattern."""
    out: list[Mutation] = []
    done: set[tuple[Any, ...]] = set()
    for number, (lines, index) in enumerate(_sources(_base_logs())):
        event = lines[index]
        out.append(Mutation(f"{lines[0]['id']}-c{number}", event["type"], "control",
                            _encode(_renamed(lines, f"c{number}"))))
        for variant, (key, what, data) in enumerate(_payload_mutations(event)):
            if (key, what) in done:
                continue
            done.add((key, what))
            mutated = [*lines[:index], {**event, "data": data}, *lines[index + 1:]]
            suffix = f"m{number}-{variant}"
            out.append(Mutation(f"{lines[0]['id']}-{suffix}", event["type"], what,
                                _encode(_renamed(mutated, suffix))))
    return out


def _encode(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)


def write_mutations(root: Path) -> dict[str, tuple[Path, Mutation]]:
    """Every mutation placed under ``root`` as dsh lays sessions out."""
    return {mutation.session_id: (place(root, mutation.log, "zstd"), mutation) for mutation in mutations()}
