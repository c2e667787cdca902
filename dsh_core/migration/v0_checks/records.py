"""dsh 0.2.1's released-v0 checks of the records some payloads carry:
schedules, title sources, subagent descriptors, teams, search requests,
todo items and tool errors (the inventory table, :mod:`.inventory`,
calls them), each failing with dsh's text (``unsupported-format``)."""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from .messages import content_blocks
from .values import ABSENT, array, exact, keys, nonempty, one_of, positive, record, refusal, string

__all__ = ["allowed_models", "model_route", "schedule_change", "search_body", "subagent_descriptor", "team_member",
           "team_message", "team_task", "title_source", "todo", "tool_error"]


# -------------------------------------------------------------------- schedules

_INSTANT = re.compile(r"^(?!0000)\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d"
                      r"\.\d{3}Z$", re.ASCII)
#: ECMAScript's WhiteSpace and LineTerminator, what ``String.prototype.trim`` strips.
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000\ufeff"


def _instant(value: Any, label: str) -> None:
    valid = type(value) is str and _INSTANT.match(value) is not None
    if valid:
        try:
            date(int(value[:4]), int(value[5:7]), int(value[8:10]))
        except ValueError:  # Date.parse rolls 02-30 over, so toISOString differs
            valid = False
    if not valid:
        raise refusal(f"{label} must be a canonical UTC instant")


def _schedule_id(value: Any, label: str) -> None:
    if nonempty(value, label).strip(_JS_SPACE) != value:
        raise refusal(f"{label} must not have surrounding whitespace")


def _schedule_record(value: Any, label: str) -> None:
    found = record(value, label)
    kind = found.get("kind")
    if kind == "after":
        keys(found, ("id", "kind", "prompt", "afterSeconds", "scheduledAt"), (), label)
        positive(found["afterSeconds"], f"{label} afterSeconds")
    elif kind == "at":
        keys(found, ("id", "kind", "prompt", "scheduledAt"), (), label)
    elif kind == "every":
        keys(found, ("id", "kind", "prompt", "everySeconds", "scheduledAt"), (), label)
        if positive(found["everySeconds"], f"{label} everySeconds") < 300:
            raise refusal(f"{label} everySeconds must be at least 300")
    else:
        raise refusal(f"{label} has unknown schedule kind")
    _schedule_id(found["id"], f"{label} id")
    nonempty(found["prompt"], f"{label} prompt")
    _instant(found["scheduledAt"], f"{label} scheduledAt")


def schedule_change(data: dict[str, Any], label: str) -> None:
    one_of(1)(data.get("version", ABSENT), f"{label} version")
    operation = data.get("operation")
    if operation == "create":
        keys(data, ("version", "operation", "schedule"), (), f"{label} data")
        _schedule_record(data["schedule"], f"{label} schedule")
        return
    keys(data, ("version", "operation", "id"), ("acceptedAt",) if operation == "dispatch" else (), f"{label} data")
    one_of("delete", "dispatch")(operation, f"{label} operation")
    _schedule_id(data["id"], f"{label} id")
    if "acceptedAt" in data:
        _instant(data["acceptedAt"], f"{label} acceptedAt")


# ------------------------------------------------- titles, subagents, teams, search


def model_route(value: Any, label: str) -> None:
    route = exact(value, label, ("provider", "model"))
    nonempty(route["provider"], f"{label} provider")
    nonempty(route["model"], f"{label} model")


def title_source(value: Any, label: str) -> None:
    source = record(value, label)
    if source.get("kind") == "provider":
        keys(source, ("kind", "provider"), ("model",), label)
        nonempty(source["provider"], f"{label} provider")
        if "model" in source:
            model_route(source["model"], f"{label} model")
        return
    keys(source, ("kind",), (), label)
    one_of("fallback", "user")(source["kind"], f"{label} kind")


def subagent_descriptor(data: dict[str, Any], label: str) -> None:
    nonempty(data["provider"], f"{label} provider")  # version 3 is checked before the member sets
    if data["mode"] == "one-shot":
        keys(data, ("mode", "version", "provider"), ("label",), f"{label} data")
        if "label" in data:
            string(data["label"], f"{label} label")
        return
    one_of("continuable")(data["mode"], f"{label} mode")
    nonempty(data.get("label", ABSENT), f"{label} label")
    for key in ("agentProvider", "agentModel", "agentReasoningEffort", "persona"):
        if key in data:
            nonempty(data[key], f"{label} {key}")
    if ("agentProvider" in data) != ("agentModel" in data):
        raise refusal(f"{label} agentProvider and agentModel must be paired")
    if "toolFilter" in data:
        tool_filter = exact(data["toolFilter"], f"{label} toolFilter", (), ("allow", "deny"))
        if not tool_filter:
            raise refusal(f"{label} toolFilter requires allow or deny")
        for key in ("allow", "deny"):
            if key in tool_filter:
                array(tool_filter[key], f"{label} {key}", nonempty)


def allowed_models(value: Any, label: str) -> None:
    seen: set[str] = set()

    def route(member: Any, item: str) -> None:
        model_route(member, item)
        key = f"{member['provider']}\0{member['model']}"
        if key in seen:
            raise refusal(f"{label} repeats route {key}")
        seen.add(key)
    if not array(value, label, route):
        raise refusal(f"{label} must be non-empty")


def team_member(value: Any, label: str) -> None:
    member = exact(value, label, ("id", "name", "description", "provider", "context", "phase"), ("error",))
    nonempty(member["id"], f"{label} id")
    for key in ("name", "description", "provider"):
        string(member[key], f"{label} {key}")
    one_of("fresh", "fork")(member["context"], f"{label} context")
    one_of("provisioning", "active", "failed")(member["phase"], f"{label} phase")
    if "error" in member:
        string(member["error"], f"{label} error")


def team_task(value: Any, label: str) -> None:
    task = exact(value, label, ("id", "revision", "subject", "description", "status", "blockedBy", "writeScopes"),
                 ("ownerId",))
    nonempty(task["id"], f"{label} id")
    positive(task["revision"], f"{label} revision")
    string(task["subject"], f"{label} subject")
    string(task["description"], f"{label} description")
    one_of("pending", "in_progress", "completed", "deleted")(task["status"], f"{label} status")
    if "ownerId" in task:
        nonempty(task["ownerId"], f"{label} ownerId")
    array(task["blockedBy"], f"{label} blockedBy", nonempty)
    array(task["writeScopes"], f"{label} writeScopes", string)


def team_message(value: Any, label: str) -> None:
    found = exact(value, label, ("id", "senderId", "senderName", "targetId", "delivery", "content"))
    for key in ("id", "senderId", "targetId"):
        nonempty(found[key], f"{label} {key}")
    string(found["senderName"], f"{label} senderName")
    one_of("quiet", "wakeup")(found["delivery"], f"{label} delivery")
    content_blocks(found["content"], f"{label} content")


def _search_text(value: Any, label: str) -> None:
    text = exact(value, label, ("type", "text"))
    one_of("text")(text["type"], f"{label} type")
    string(text["text"], f"{label} text")


def _search_message(value: Any, label: str) -> None:
    found = exact(value, label, ("role", "content"))
    one_of("user")(found["role"], f"{label} role")
    if len(array(found["content"], f"{label} content", _search_text)) != 1:
        raise refusal(f"{label} content must contain one text block")


def _search_tool(value: Any, label: str) -> None:
    tool = exact(value, label, ("type", "name", "max_uses"))
    one_of("web_search_20250305")(tool["type"], f"{label} type")
    one_of("web_search")(tool["name"], f"{label} name")
    positive(tool["max_uses"], f"{label} max_uses")


def search_body(value: Any, label: str) -> None:
    body = exact(value, label, ("model", "max_tokens", "messages", "tools"))
    nonempty(body["model"], f"{label} model")
    positive(body["max_tokens"], f"{label} max_tokens")
    if len(array(body["messages"], f"{label} messages", _search_message)) != 1:
        raise refusal(f"{label} messages must contain one user message")
    if len(array(body["tools"], f"{label} tools", _search_tool)) != 1:
        raise refusal(f"{label} tools must contain one web search tool")


def todo(value: Any, label: str) -> None:
    item = exact(value, label, ("content", "status"))
    string(item["content"], f"{label} content")
    one_of("pending", "in_progress", "completed")(item["status"], f"{label} status")


def tool_error(value: Any, label: str) -> None:
    error = exact(value, label, ("name", "code"))
    nonempty(error["name"], f"{label} name")
    nonempty(error["code"], f"{label} code")
