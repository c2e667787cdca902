"""A session page as a timeline, and tool calls paired with their results.

:func:`timeline` lays out one page of a session (``session_page``) by its
turns and steps, each with its timings and cost, the tool calls its model
messages made with the result each got and how long after the call it
came (both events' own times), and each finding at the step it names (a
finding naming none stays with the page). :func:`tool_results` pairs the
calls of a page's messages with the results on it, for the conversation.
"""

from __future__ import annotations

import json
from typing import Any

from dsh_core.formats.v4.session import derive_message

__all__ = ["pretty_json", "timeline", "tool_results"]

#: A step without timings or usage (a store of an older layout kept none).
_UNTIMED = {**dict.fromkeys(("startedAt", "firstOutputAt", "endedAt", "durationMs", "timeToFirstOutputMs", "provider",
                             "model", "costUsd")),
            **dict.fromkeys(("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens"), 0)}


def pretty_json(text: Any) -> str:
    """A JSON text indented (a text that is not JSON, as it is)."""
    if not isinstance(text, str):
        return json.dumps(text, indent=2, ensure_ascii=False)
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _call_id(message: dict[str, Any]) -> Any:
    """The tool call a tool result message answers."""
    source = message.get("source") or {}
    return source.get("callId") or message.get("toolCallId")


def tool_results(session: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The results on a page, by the id of the call each answers: ``{seq,
    time, message, isError}``."""
    results = {}
    for event in session["surface"]:
        message = derive_message(event["type"], event["data"])
        if isinstance(message, dict) and (message.get("source") or {}).get("kind") == "tool":
            blocks = [block for block in message.get("content") or () if isinstance(block, dict)]
            results[str(_call_id(message))] = {"seq": event["seq"], "time": event.get("time"), "message": message,
                                               "isError": any(block.get("isError") for block in blocks)}
    return results


def timeline(session: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The page's turns, each ``{turn..., steps: [{step..., calls, findings}]}``,
    and the findings that name no step of the page."""
    results = tool_results(session)
    steps: dict[tuple[Any, Any], dict[str, Any]] = {
        (step["turn"], step["step"]): {**step, "calls": [], "findings": []} for step in session.get("steps") or ()}
    for event in session["surface"]:
        data = event["data"]
        message = derive_message(event["type"], data)
        if not isinstance(message, dict) or message.get("role") != "assistant" or not isinstance(data, dict):
            continue
        step = steps.setdefault((data.get("turn"), data.get("step")), {  # a step the store kept no row of
            **_UNTIMED, "turn": data.get("turn"), "step": data.get("step"), "calls": [], "findings": []})
        for block in message.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool-call":
                result = results.get(str(block.get("id")))
                took = (result["time"] - event["time"] if result and result["time"] is not None
                        and event.get("time") is not None else None)
                step["calls"].append({"id": block.get("id"), "name": block.get("name"), "seq": event["seq"],
                                      "arguments": pretty_json(block.get("arguments")), "result": result,
                                      "durationMs": took})
    unplaced: list[dict[str, Any]] = []
    for finding in session.get("findings") or ():
        placed = steps.get((finding.get("turn"), finding.get("step")))
        (placed["findings"] if placed is not None else unplaced).append(finding)
    turns = []
    for turn in session.get("turns") or ():
        own = sorted((step for (number, _), step in steps.items() if number == turn.get("turn")),
                     key=lambda step: step["step"] if isinstance(step["step"], int) else -1)
        turns.append({**turn, "steps": own})
    return turns, unplaced
