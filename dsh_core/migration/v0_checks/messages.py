"""dsh 0.2.1's v0 checks of messages and what they carry.

``messageValue`` and its parts as dsh's v0→v1 edge runs them at format v0:
content blocks (text, reasoning, image, tool call, tool result; other types
kept if named), message sources by kind (:data:`SOURCES`; other kinds kept
if named), a legacy goal message against the change it renders, the goal
records themselves, token usage and model failures.
"""

from __future__ import annotations

from typing import Any, Callable

from ...jsonvalue import json_equal
from .values import (ABSENT, Check, array, boolean, count, exact, finite, js, js_keys, keys, nonempty, one_of,
                        positive, record, refusal, safe_integer, string)

__all__ = ["SOURCES", "content_blocks", "failure", "goal_change", "message", "message_source", "token_usage"]


# ------------------------------------------------------- usage, failures, blocks


def failure(value: Any, label: str) -> None:
    found = exact(value, label, ("message", "code"), ("status", "providerRetryAfterMs", "requestId"))
    nonempty(found.get("message", ABSENT), f"{label} message")
    nonempty(found.get("code", ABSENT), f"{label} code")
    if "status" in found and not 100 <= safe_integer(found["status"], f"{label} status") <= 599:
        raise refusal(f"{label} status must be 100 through 599")
    if "providerRetryAfterMs" in found and finite(found["providerRetryAfterMs"], f"{label} providerRetryAfterMs") <= 0:
        raise refusal(f"{label} providerRetryAfterMs must be positive")
    if "requestId" in found:
        nonempty(found["requestId"], f"{label} requestId")


def token_usage(value: Any, label: str) -> None:
    found = exact(value, label, ("inputTokens", "outputTokens"),
                  ("totalTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens"))
    for key in js_keys(found):
        count(found[key], f"{label} {key}")


def content_blocks(value: Any, label: str) -> None:
    array(value, label, content_block)


def content_block(value: Any, label: str) -> None:
    block = record(value, label)
    kind = block.get("type", ABSENT)
    if kind in ("text", "reasoning"):
        keys(block, ("type", "text"), (), label)
        string(block["text"], f"{label} text")
    elif kind == "image":
        keys(block, ("type", "attachment"), (), label)
        image_attachment(block["attachment"], f"{label} attachment")
    elif kind == "tool-call":
        keys(block, ("type", "id", "name", "arguments"), (), label)
        nonempty(block["id"], f"{label} id")
        nonempty(block["name"], f"{label} name")
        string(block["arguments"], f"{label} arguments")
    elif kind == "tool-result":
        keys(block, ("type", "toolCallId", "content"), ("isError",), label)
        nonempty(block["toolCallId"], f"{label} toolCallId")
        content_blocks(block["content"], f"{label} content")
        if "isError" in block:
            boolean(block["isError"], f"{label} isError")
    else:
        nonempty(kind, f"{label} type")


def image_attachment(value: Any, label: str) -> None:
    found = exact(value, label, ("attachmentId", "mediaType", "bytes", "width", "height"),
                  ("name", "originalDimensions"))
    nonempty(found["attachmentId"], f"{label} attachmentId")
    one_of("image/png", "image/jpeg", "image/webp", "image/gif")(found["mediaType"], f"{label} mediaType")
    count(found["bytes"], f"{label} bytes")
    positive(found["width"], f"{label} width")
    positive(found["height"], f"{label} height")
    if "name" in found:
        string(found["name"], f"{label} name")
    if "originalDimensions" in found:
        dimensions = exact(found["originalDimensions"], f"{label} originalDimensions", ("width", "height"))
        positive(dimensions["width"], f"{label} original width")
        positive(dimensions["height"], f"{label} original height")


# ------------------------------------------------------------ messages, sources


def message(expected: str | None) -> Check:
    """dsh's ``messageValue`` at format v0 for an ``expected`` role owner
    (``"assistant"``, ``"user"``, ``"tool"`` or ``None``: any role)."""
    def check(value: Any, label: str) -> None:
        found = exact(value, label, ("id", "role", "content", "source"))
        nonempty(found["id"], f"{label} id")
        if expected is None:
            one_of("system", "user", "assistant")(found["role"], f"{label} role")
        else:
            one_of("assistant" if expected == "assistant" else "user")(found["role"], f"{label} role")
        content_blocks(found["content"], f"{label} content")
        source = record(found["source"], f"{label} source")
        if expected == "user" and source.get("kind") == "goal" and "change" in source:
            _legacy_goal_message(found, source, label)
        else:
            message_source(source, f"{label} source", expected)
        if expected == "tool":
            content = found["content"]
            block = record(content[0], f"{label} tool result") if len(content) == 1 else None
            if block is None or block.get("type") != "tool-result" or block.get("toolCallId") != source.get("callId"):
                raise refusal(f"{label} must contain exactly one tool-result block")
    return check


def _legacy_goal_message(found: dict[str, Any], source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "goalId", "revision", "round", "change"), (), f"{label} source")
    nonempty(source["goalId"], f"{label} source goalId")
    positive(source["revision"], f"{label} source revision")
    if not (type(source["round"]) is int and source["round"] == 0):
        raise refusal(f"{label} legacy goal source round must be 0")
    change = record(source["change"], f"{label} source change")
    goal_change(change, f"{label} source change")
    cleared = change["operation"] == "clear"
    ref = record(change["cleared"] if cleared else change["goal"], f"{label} source change ref")
    if not json_equal(source["goalId"], ref["id"]) or not json_equal(source["revision"], ref["revision"]):
        raise refusal(f"{label} legacy goal source does not match its change")
    members = ("cleared", "clearedAt") if cleared else ("goal", "roundsStarted", "createdAt", "updatedAt")
    expected = [{"type": "text", "text": f"<goal_state>{js({key: change[key] for key in members})}</goal_state>"}]
    if not json_equal(found["content"], expected):
        raise refusal(f"{label} legacy goal content does not match its change")


def _named(*members: str, non_empty: tuple[str, ...] = (), strings: tuple[str, ...] = ()) -> Callable[[dict[str, Any], str], None]:
    """A source variant of exact members, some non-empty strings, some strings."""
    def check(source: dict[str, Any], label: str) -> None:
        keys(source, members, (), label)
        for key in non_empty:
            nonempty(source[key], f"{label} {key}")
        for key in strings:
            string(source[key], f"{label} {key}")
    return check


def _user_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind",), ("rpcId", "clientTimeZone"), label)
    for key in ("rpcId", "clientTimeZone"):
        if key in source:
            nonempty(source[key], f"{label} {key}")


def _model_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "provider", "model"), ("replayState",), label)
    nonempty(source["provider"], f"{label} provider")
    nonempty(source["model"], f"{label} model")


def _instructions_change(value: Any, label: str) -> None:
    change = exact(value, label, ("action", "scope", "path"), ("digest",))
    one_of("set", "replace", "remove")(change["action"], f"{label} action")
    string(change["scope"], f"{label} scope")
    string(change["path"], f"{label} path")
    if "digest" in change:
        string(change["digest"], f"{label} digest")


def _agent_instructions_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "form", "changes"), ("baseline", "baselineIdentity"), label)
    one_of("instructions")(source["form"], f"{label} form")
    if "baseline" in source:
        one_of(True)(source["baseline"], f"{label} baseline")
    if "baselineIdentity" in source:
        nonempty(source["baselineIdentity"], f"{label} baselineIdentity")
    array(source["changes"], f"{label} changes", _instructions_change)


def _goal_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "goalId", "revision", "round"), (), label)
    nonempty(source["goalId"], f"{label} goalId")
    positive(source["revision"], f"{label} revision")
    positive(source["round"], f"{label} round")


def _skill_invocation_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "name", "form"), (), label)
    nonempty(source["name"], f"{label} name")
    one_of("instructions")(source["form"], f"{label} form")


def _catalog_entry(value: Any, label: str) -> None:
    entry = exact(value, label, ("name", "description"))
    nonempty(entry["name"], f"{label} name")
    string(entry["description"], f"{label} description")


def _skill_catalog_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "form", "entries"), ("update",), label)
    one_of("catalog")(source["form"], f"{label} form")
    if "update" in source:
        one_of(True)(source["update"], f"{label} update")
    array(source["entries"], f"{label} entries", _catalog_entry)


def _relay_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "form", "senderSessionId"), (), label)
    one_of("relay")(source["form"], f"{label} form")
    nonempty(source["senderSessionId"], f"{label} senderSessionId")


def _settled_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "form", "summary", "senderSessionId"), (), label)
    one_of("notice")(source["form"], f"{label} form")
    string(source["summary"], f"{label} summary")
    nonempty(source["senderSessionId"], f"{label} senderSessionId")


def _webhook_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "provider", "source", "deliveryId", "ruleId", "form", "summary"), (), label)
    for key in ("provider", "source", "deliveryId", "ruleId"):
        nonempty(source[key], f"{label} {key}")
    one_of("notice")(source["form"], f"{label} form")
    string(source["summary"], f"{label} summary")


def _snapshot_section(value: Any, label: str) -> None:
    section = exact(value, label, ("name", "text"))
    nonempty(section["name"], f"{label} name")
    string(section["text"], f"{label} text")


def _plugin_source(source: dict[str, Any], label: str) -> None:
    compact = source.get("plugin") == "compact"
    keys(source, ("kind", "plugin"), ("form", "sections", "summary") + (("compactionId", "sourceCommandId")
                                                                        if compact else ()), label)
    nonempty(source["plugin"], f"{label} plugin")
    if compact:
        nonempty(source.get("compactionId", ABSENT), f"{label} compactionId")
        if "sourceCommandId" in source:
            nonempty(source["sourceCommandId"], f"{label} sourceCommandId")
    if "form" not in source:
        return
    form = one_of("instructions", "catalog", "snapshot", "notice", "relay", "recall")(source["form"], f"{label} form")
    if form == "snapshot":
        array(source.get("sections", ABSENT), f"{label} sections", _snapshot_section)
    elif "sections" in source:
        raise refusal(f"{label} sections require snapshot form")
    if form == "notice":
        string(source.get("summary", ABSENT), f"{label} summary")
    elif "summary" in source:
        raise refusal(f"{label} summary requires notice form")


_REFERENCE = ("sessionId", "label", "capturedThroughSeq", "compacted", "originalMessages", "retainedMessages",
              "omittedMessages", "omittedBytes", "truncated", "inputIndex")


def _session_reference_source(source: dict[str, Any], label: str) -> None:
    keys(source, ("kind", "form", "version", "references"), (), label)
    one_of("recall")(source["form"], f"{label} form")
    one_of(1)(source["version"], f"{label} version")
    seen: set[str] = set()
    position = [0]

    def reference(value: Any, item: str) -> None:
        found = exact(value, item, _REFERENCE)  # capturedFormatVersion is admitted from v1 on
        nonempty(found["sessionId"], f"{item} sessionId")
        string(found["label"], f"{item} label")
        if found["capturedThroughSeq"] is not None:
            count(found["capturedThroughSeq"], f"{item} capturedThroughSeq")
        boolean(found["compacted"], f"{item} compacted")
        original, retained, omitted, omitted_bytes, index = (
            count(found[key], f"{item} {key}")
            for key in ("originalMessages", "retainedMessages", "omittedMessages", "omittedBytes", "inputIndex"))
        truncated = boolean(found["truncated"], f"{item} truncated")
        if retained > original or omitted != original - retained:
            raise refusal(f"{item} message counts are inconsistent")
        if truncated != (omitted > 0 or omitted_bytes > 0):
            raise refusal(f"{item} truncated disagrees with omitted content")
        if index != position[0]:
            raise refusal(f"{label} inputIndex must match reference position")
        position[0] += 1
        if found["sessionId"] in seen:
            raise refusal(f"{label} repeats sessionId {found['sessionId']}")
        seen.add(found["sessionId"])
    if not array(source["references"], f"{label} references", reference):
        raise refusal(f"{label} references must be non-empty")


#: dsh's message source variants by ``kind``; any other kind needs only a non-empty name.
SOURCES: dict[str, Callable[[dict[str, Any], str], None]] = {
    "user": _user_source,
    "plugin": _plugin_source,
    "model": _model_source,
    "tool": _named("kind", "callId", non_empty=("callId",)),
    "agent-instructions": _agent_instructions_source,
    "session-reference": _session_reference_source,
    "team-message": _named("kind", "teamId", "messageId", "senderId", "senderName",
                           non_empty=("teamId", "messageId", "senderId"), strings=("senderName",)),
    "goal": _goal_source,
    "skill-invocation": _skill_invocation_source,
    "skill-catalog": _skill_catalog_source,
    "coordinator": _relay_source,
    "subagent-report": _relay_source,
    "subagent-settled": _settled_source,
    "webhook": _webhook_source,
}


def message_source(value: Any, label: str, expected: str | None) -> None:
    source = record(value, label)
    kind = source.get("kind", ABSENT)
    if expected == "assistant" and kind != "model":
        raise refusal(f"{label} must be model source")
    if expected == "tool" and kind != "tool":
        raise refusal(f"{label} must be tool source")
    variant = SOURCES.get(kind) if type(kind) is str else None
    if variant is None:
        nonempty(kind, f"{label} kind")
    else:
        variant(source, label)


# ------------------------------------------------------------------------ goals


def _goal_ref(value: Any, label: str) -> None:
    ref = exact(value, label, ("id", "revision"))
    nonempty(ref["id"], f"{label} id")
    positive(ref["revision"], f"{label} revision")


def _goal_snapshot(value: Any, label: str) -> None:
    goal = exact(value, label, ("id", "revision", "objective", "phase", "maxGoalRounds"), ("blockedReason",))
    nonempty(goal["id"], f"{label} id")
    positive(goal["revision"], f"{label} revision")
    nonempty(goal["objective"], f"{label} objective")
    one_of("active", "paused", "blocked", "complete")(goal["phase"], f"{label} phase")
    positive(goal["maxGoalRounds"], f"{label} maxGoalRounds")
    if goal["phase"] == "blocked":
        reason = exact(goal.get("blockedReason", ABSENT), f"{label} blockedReason", ("code", "message"))
        nonempty(reason["code"], f"{label} blocked code")
        nonempty(reason["message"], f"{label} blocked message")
    elif "blockedReason" in goal:
        raise refusal(f"{label} blockedReason requires blocked phase")


def goal_change(data: dict[str, Any], label: str) -> None:
    one_of("goal/change")(data.get("kind", ABSENT), f"{label} kind")
    one_of(1)(data.get("version", ABSENT), f"{label} version")
    if data.get("operation") == "clear":
        keys(data, ("kind", "version", "operation", "cleared", "clearedAt"), (), f"{label} data")
        _goal_ref(data["cleared"], f"{label} cleared")
        count(data["clearedAt"], f"{label} clearedAt")
        return
    keys(data, ("kind", "version", "operation", "goal", "roundsStarted", "createdAt", "updatedAt"), (), f"{label} data")
    one_of("create", "edit", "pause", "resume", "complete", "block")(data["operation"], f"{label} operation")
    _goal_snapshot(data["goal"], f"{label} goal")
    for key in ("roundsStarted", "createdAt", "updatedAt"):
        count(data[key], f"{label} {key}")
