"""dsh 0.2.1's frozen released-v0 inventory: the payload checks of its v0→v1 edge.

The edge validates each normalized event (every type but ``assistant/chunk``)
as dsh's ``assertReleasedEventPayload`` does at format version 0: the type
must be in the inventory (:data:`INVENTORY`), a ``subagent/descriptor`` must
be version 3, the ``data`` members must be the type's required and optional
ones, an opaque member must be lossless JSON, and then the nested checks of
dsh's ``assertReleasedPayloadSemantics`` run. Those are a table
(:data:`PAYLOAD`): per type, its steps in dsh's order, so the first failure
is dsh's; a step checks one member (:func:`~.values.need`,
:func:`~.values.opt`, :func:`~.values.each`) or the whole payload.
Messages and what they carry are checked by :mod:`.messages`; turn
ends and request headers here; the records in schedules, titles,
subagents, teams and search requests by :mod:`.records`; the primitives
are :mod:`.values`. Every failure is dsh's text and its category
(``unsupported-format``).
"""

from __future__ import annotations

from typing import Any

from ...errors import FormatUnsupportedError
from .messages import content_blocks, failure, goal_change, message, token_usage
from .records import (allowed_models, model_route, schedule_change, search_body, subagent_descriptor, team_member,
                         team_message, team_task, title_source, todo, tool_error)
from .values import (ABSENT, COORDS, Step, array, array_of, before, boolean, count, each, earlier, exact,
                        finite, js, js_keys, keys, lossless, need, nonempty, nonnegative, one_of, opt, positive, record,
                        refusal, safe_integer, seq_array, seqs, string, whole)

__all__ = ["INVENTORY", "PAYLOAD", "check_payload"]

# ------------------------------------------------------- turn ends, request headers


def turn_end_reason(value: Any, label: str) -> None:
    reason = record(value, label)
    kind = reason.get("kind", ABSENT)
    if kind in ("completed", "blocked", "max-tokens", "interrupted"):
        keys(reason, ("kind",), (), label)
    elif kind == "aborted":
        keys(reason, ("kind", "reason"), (), label)
        cause = record(reason["reason"], f"{label} abort cause")
        if cause.get("kind") == "hook":
            keys(cause, ("kind", "reason"), (), f"{label} abort cause")
            string(cause["reason"], f"{label} abort reason")
        else:
            keys(cause, ("kind",), (), f"{label} abort cause")
            one_of("user", "parent", "disposed", "legacy")(cause["kind"], f"{label} abort kind")
    elif kind == "error":
        keys(reason, ("kind", "error"), (), label)
        failure(reason["error"], f"{label} error")
    else:
        nonempty(kind, f"{label} kind")


def _tool_schema(value: Any, label: str) -> None:
    schema = exact(value, label, ("name", "description", "parameters"))
    nonempty(schema["name"], f"{label} name")
    string(schema["description"], f"{label} description")
    record(schema["parameters"], f"{label} parameters")


def request_header(value: Any, label: str) -> None:
    header = exact(value, label, ("config",), ("adapterDefaults", "system", "tools"))
    config = exact(header["config"], f"{label} config", ("provider", "model"),
                   ("reasoningEffort", "temperature", "maxTokens", "stop"))
    nonempty(config["provider"], f"{label} provider")
    nonempty(config["model"], f"{label} model")
    for key, check in (("reasoningEffort", nonempty), ("temperature", finite), ("maxTokens", positive),
                       ("stop", array_of(string))):
        if key in config:
            check(config[key], f"{label} {key}")
    if "adapterDefaults" in header:
        defaults = exact(header["adapterDefaults"], f"{label} adapterDefaults", (), ("reasoningEffort", "maxTokens"))
        for key in js_keys(defaults):
            one_of(True)(defaults[key], f"{label} adapterDefaults {key}")
            if key not in config:
                raise refusal(f"{label} adapter default {key} lacks config value")
    if "system" in header:
        string(header["system"], f"{label} system")
    if "tools" in header:
        array(header["tools"], f"{label} tools", _tool_schema)


# ------------------------------------------------------------ whole-payload rules


def _shadowed(data: dict[str, Any], label: str, seq: int) -> None:
    shadowed = exact(data["shadowedRange"], f"{label} shadowedRange", ("start", "end"))
    start = earlier(shadowed["start"], seq, f"{label} shadowedRange start")
    end = earlier(shadowed["end"], seq, f"{label} shadowedRange end")
    seqs = seq_array(data["shadowedSeqs"], seq, f"{label} shadowedSeqs", True)
    if seqs[0] != start or seqs[-1] != end:
        raise refusal(f"{label} shadowedRange must match shadowedSeqs endpoints")
    count(data["shadowedTokenCount"], f"{label} shadowedTokenCount")


def _stream_call_needs_output(data: dict[str, Any], label: str, seq: int) -> None:
    if data.get("llmStreamCall") is True and "rawOutput" not in data:
        raise refusal(f"{label} llmStreamCall requires rawOutput")


def _duration(data: dict[str, Any], label: str, seq: int) -> None:
    nonnegative(finite(data["durationMs"], f"{label} durationMs"), f"{label} durationMs")


def _retry_budget(data: dict[str, Any], label: str, seq: int) -> None:
    if data["mode"] == "normal":
        if data["retry"] > positive(data.get("maxRetries", ABSENT), f"{label} maxRetries"):
            raise refusal(f"{label} retry exceeds maxRetries")
    elif "maxRetries" in data:
        raise refusal(f"{label} always mode must omit maxRetries")
    delay = finite(data["delayMs"], f"{label} delayMs")
    nonnegative(delay, f"{label} delayMs")
    if delay > 2147483647:
        raise refusal(f"{label} delayMs exceeds the timer range")


def _source_user(value: Any, label: str) -> None:
    one_of("user")(exact(value, label, ("kind",))["kind"], f"{label} kind")


_TEAM = (need("version", one_of(1)), need("teamId", nonempty))
_WORKFLOW = (need("runId", nonempty), need("seq", positive))
_COMPACTION_MARK = (need("compactionId", nonempty), opt("sourceCommandId", nonempty),
                    need("turn", lambda value, label: value is None or count(value, label)),
                    opt("error", string))
_CODE_DISPATCH = (need("rootCallId", nonempty), need("parentCallId", nonempty), need("subCallId", nonempty),
                  need("name", nonempty))

#: dsh's ``assertReleasedPayloadSemantics`` at v0: per type, its checks in dsh's order.
PAYLOAD: dict[str, tuple[Step, ...]] = {
    "agent-preset/selected": (need("agentPreset", string),),
    "agent/inbox/spliced": (need("target", one_of("next-turn", "next-step")), need("start", count),
                            opt("removedCount", count), each("inserted", message("user"), "inserted message"),
                            opt("outcome", one_of("canceled"))),
    "approval/asked": (need("id", nonempty), need("toolName", nonempty), opt("callId", nonempty),
                       opt("reason", string)),
    "approval/decided": (need("id", nonempty),
                         need("outcome", one_of("allowed-once", "rejected", "cancelled", "unavailable"))),
    "approval/policy": (need("policy", one_of("ask", "never")), opt("source", one_of("delegation"))),
    "assistant/message": (*COORDS, need("message", message("assistant")), opt("usage", token_usage),
                          opt("interrupted", one_of(True))),
    "command/done": (need("commandId", nonempty), need("kind", one_of("success", "error")), opt("text", string),
                     before("sourceEventSeq", optional=True)),
    "command/run": (need("commandId", nonempty), need("name", nonempty), opt("args", string),
                    need("source", _source_user)),
    "compaction/end": _COMPACTION_MARK,
    "compaction/prune": (_shadowed,),
    "compaction/start": _COMPACTION_MARK,
    "compaction/summary": (_stream_call_needs_output, need("compactionId", nonempty), opt("sourceCommandId", nonempty),
                           need("summary", content_blocks), _shadowed, need("provider", nonempty),
                           need("model", nonempty), opt("maxTokens", count), opt("usage", token_usage),
                           opt("rawOutput", content_blocks), opt("llmStreamCall", one_of(True))),
    "feedback/record": (need("text", nonempty),),
    "goal/change": (whole(goal_change),),
    "hook/invoked": (need("turn", count), need("point", nonempty), need("dialect", one_of("claude-code", "codex")),
                     opt("matcher", string), need("handlerId", nonempty)),
    "hook/result": (need("turn", count), need("point", nonempty), need("handlerId", nonempty),
                    need("decision", nonempty), opt("exitCode", safe_integer), opt("stderrSummary", string),
                    _duration),
    "llm/retry": (need("retryId", nonempty), *COORDS, need("provider", nonempty),
                  need("mode", one_of("normal", "always")), need("policyKey", nonempty), need("retry", positive),
                  _retry_budget, need("failure", failure)),
    "llm/retry-started": (need("retryId", nonempty), *COORDS, need("retry", positive)),
    "model/selection": (need("provider", nonempty), need("model", nonempty), opt("reasoningEffort", nonempty)),
    "permission/preset": (need("preset", nonempty),),
    "plan/mode": (need("active", boolean),),
    "request/context": (need("provider", nonempty), need("model", nonempty), opt("contextWindow", positive)),
    "request/header": (need("header", request_header), need("reason", one_of("initial", "resume", "change", "series")),
                       opt("startsSeries", one_of(True))),
    "sandbox/mode": (need("mode", one_of("read-only", "workspace-write", "danger-full-access")),
                     opt("source", one_of("delegation"))),
    "schedule/change": (whole(schedule_change),),
    "session-log-deepseek/delivery-accepted": (need("sessionId", nonempty), before("throughSeq")),
    "session/end-seed": (),
    "session/title": (need("title", nonempty), seqs("messageSeqs", False), need("source", title_source)),
    "session/title-llm-request": (need("titleProvider", nonempty), seqs("messageSeqs", True),
                                  need("route", model_route), need("system", string),
                                  each("messages", message(None), "message"), need("maxTokens", positive)),
    "step/end": COORDS,
    "step/start": COORDS,
    "subagent/descriptor": (whole(subagent_descriptor),),
    "subagent/model-selection-policy": (need("allowedModels", allowed_models),),
    "team/member": (*_TEAM, need("member", team_member)),
    "team/message/delivered": (*_TEAM, need("messageId", nonempty), need("targetId", nonempty)),
    "team/message/queued": (*_TEAM, need("message", team_message)),
    "team/task": (*_TEAM, need("task", team_task)),
    "todo/write": (need("todos", array_of(todo)),),
    "tool-workflow/agent-end": (*_WORKFLOW, need("outcome", one_of("completed", "failed", "cancelled"))),
    "tool-workflow/agent-start": (*_WORKFLOW, need("label", string), opt("phase", string), need("childId", nonempty)),
    "tool-workflow/run-end": (need("runId", nonempty), need("stopReason", one_of("completed", "cancelled", "error"))),
    "tool-workflow/run-start": (need("runId", nonempty), need("name", nonempty)),
    "tool/call": (*COORDS, need("callId", nonempty), need("name", nonempty), need("arguments", string)),
    "tool/code-dispatch": (*_CODE_DISPATCH, need("isError", boolean), need("content", content_blocks)),
    "tool/code-dispatch-start": _CODE_DISPATCH,
    "tool/result": (*COORDS, need("message", message("tool")), opt("error", tool_error, "error")),
    "turn/end": (need("turn", count), need("reason", turn_end_reason)),
    "turn/start": (need("turn", count),),
    "user/message": (whole(message("user")),),
    "web/deepseek-search-llm-request": (need("endpoint", nonempty), need("apiVersion", nonempty),
                                        need("body", search_body)),
}

#: dsh's frozen v0 inventory: each type's required, optional and opaque ``data`` members.
INVENTORY: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "agent-preset/selected": (("agentPreset",), (), ()),
    "agent/inbox/spliced": (("target", "start", "inserted"), ("removedCount", "outcome"), ()),
    "approval/asked": (("id", "toolName"), ("callId", "reason"), ()),
    "approval/decided": (("id", "outcome"), (), ()),
    "approval/policy": (("policy",), ("source",), ()),
    "assistant/chunk": (("turn", "step", "chunk"), (), ()),
    "assistant/message": (("turn", "step", "message"), ("usage", "interrupted"), ()),
    "command/done": (("commandId", "kind"), ("text", "sourceEventSeq"), ()),
    "command/run": (("commandId", "name", "source"), ("args",), ()),
    "compaction/end": (("compactionId", "turn"), ("sourceCommandId", "error"), ()),
    "compaction/prune": (("shadowedRange", "shadowedSeqs", "shadowedTokenCount"), (), ()),
    "compaction/start": (("compactionId", "turn"), ("sourceCommandId",), ()),
    "compaction/summary": (("compactionId", "summary", "shadowedRange", "shadowedSeqs", "shadowedTokenCount",
                            "provider", "model"), ("sourceCommandId", "maxTokens", "usage", "rawOutput",
                                                   "llmStreamCall"), ()),
    "feedback/record": (("text",), (), ()),
    "goal/change": (("kind", "version", "operation"), ("goal", "roundsStarted", "createdAt", "updatedAt", "cleared",
                                                       "clearedAt"), ()),
    "hook/invoked": (("turn", "point", "dialect", "handlerId"), ("matcher",), ()),
    "hook/result": (("turn", "point", "handlerId", "decision", "durationMs"), ("exitCode", "stderrSummary"), ()),
    "llm/retry": (("retryId", "turn", "step", "provider", "mode", "policyKey", "retry", "delayMs", "failure"),
                  ("maxRetries",), ()),
    "llm/retry-started": (("retryId", "turn", "step", "retry"), (), ()),
    "model/selection": (("provider", "model"), ("reasoningEffort",), ()),
    "permission/preset": (("preset",), (), ()),
    "plan/mode": (("active",), (), ()),
    "request/context": (("provider", "model"), ("contextWindow",), ()),
    "request/header": (("header", "reason"), ("startsSeries",), ()),
    "sandbox/mode": (("mode",), ("source",), ()),
    "schedule/change": (("version", "operation"), ("schedule", "id", "acceptedAt"), ()),
    "session-log-deepseek/delivery-accepted": (("sessionId", "throughSeq"), (), ()),
    "session/end-seed": ((), (), ()),
    "session/title": (("title", "messageSeqs", "source"), (), ()),
    "session/title-llm-request": (("titleProvider", "messageSeqs", "route", "system", "messages", "maxTokens"), (),
                                  ()),
    "step/end": (("turn", "step"), (), ()),
    "step/start": (("turn", "step"), (), ()),
    "subagent/descriptor": (("mode", "version", "provider"), ("label", "agentProvider", "agentModel",
                                                              "agentReasoningEffort", "persona", "toolFilter"), ()),
    "subagent/model-selection-policy": (("allowedModels",), (), ()),
    "team/member": (("version", "teamId", "member"), (), ()),
    "team/message/delivered": (("version", "teamId", "messageId", "targetId"), (), ()),
    "team/message/queued": (("version", "teamId", "message"), (), ()),
    "team/task": (("version", "teamId", "task"), (), ()),
    "todo/write": (("todos",), (), ()),
    "tool-workflow/agent-end": (("runId", "seq", "outcome"), (), ()),
    "tool-workflow/agent-start": (("runId", "seq", "label", "childId"), ("phase",), ()),
    "tool-workflow/run-end": (("runId", "stopReason"), (), ()),
    "tool-workflow/run-start": (("runId", "name"), (), ()),
    "tool/call": (("turn", "step", "callId", "name", "arguments"), (), ()),
    "tool/code-dispatch": (("rootCallId", "parentCallId", "subCallId", "name", "arguments", "isError", "content"), (),
                           ("arguments",)),
    "tool/code-dispatch-start": (("rootCallId", "parentCallId", "subCallId", "name", "arguments"), (),
                                 ("arguments",)),
    "tool/result": (("turn", "step", "message"), ("error", "meta"), ("meta",)),
    "turn/end": (("turn", "reason"), (), ()),
    "turn/start": (("turn",), (), ()),
    "user/message": (("role", "id", "content", "source"), (), ()),
    "web/deepseek-search-llm-request": (("endpoint", "apiVersion", "body"), (), ()),
}


def check_payload(event: dict[str, Any]) -> None:
    """dsh's ``assertReleasedEventPayload(event, 0)`` for one normalized event
    whose ``data`` is an object; raises :class:`FormatUnsupportedError`."""
    event_type, seq, data = event["type"], event["seq"], event["data"]
    members = INVENTORY.get(event_type)
    if members is None:
        raise FormatUnsupportedError(f"format v0 contains unknown historical event type {js(event_type)} at seq "
                                     f"{seq}; migration refuses unknown historical events even when ignorable")
    label = f"{event_type} {seq}"
    if event_type == "subagent/descriptor" and not (type(data.get("version")) is int and data["version"] == 3):
        raise FormatUnsupportedError(f"{label} uses unsupported descriptor version "
                                     f"{count(data.get('version', ABSENT), f'{label} version')}")
    required, optional, opaque = members
    keys(data, required, optional, f"{label} data")
    for key in opaque:
        if key in data and not lossless(data[key]):
            raise refusal(f"{label} opaque {key} is not lossless JSON")
    for step in PAYLOAD[event_type]:
        step(data, label, seq)
