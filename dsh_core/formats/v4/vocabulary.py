"""The v4 event vocabulary (dsh 0.2.1's ``KNOWN_SESSION_EVENT_TYPES``).

A type outside it is refused unless its event is marked ``ignorable: true``
(then it is kept, uninterpreted). Evolution: a type, once written, is forever.
"""

from __future__ import annotations

__all__ = ["KNOWN_TYPES", "SURFACE_TYPES"]

#: Event types whose events may join the model-visible surface.
SURFACE_TYPES = frozenset({"system/message", "developer/message", "user/message", "assistant/message", "tool/result"})

KNOWN_TYPES = frozenset({
    "agent-preset/selected", "agent/inbox/spliced", "approval/asked", "approval/decided", "approval/policy",
    "assistant/attempt", "assistant/message", "command/done", "command/run", "compaction/end",
    "compaction/prune", "compaction/start", "compaction/summary", "deliverables/presented",
    "developer/message", "feedback/message-delete", "feedback/message-put", "feedback/record", "goal/change",
    "hook/invoked", "hook/result", "image/offload", "job/registered", "job/settled", "llm/retry",
    "llm/retry-started", "model/selection", "permission/preset", "plan/mode", "request/context",
    "request/header", "sandbox/mode", "schedule/change", "session-log-deepseek/delivery-accepted",
    "session/end-seed", "session/title", "session/title-llm-request", "step/end", "step/start",
    "subagent/catalog", "subagent/descriptor", "subagent/model-selection-policy", "system/message",
    "team/member", "team/message/delivered", "team/message/queued", "team/task", "todo/write",
    "tool-workflow/agent-end", "tool-workflow/agent-start", "tool-workflow/run-end",
    "tool-workflow/run-start", "tool/call", "tool/ptc-dispatch", "tool/ptc-dispatch-start", "tool/result",
    "turn/end", "turn/start", "user/message", "web/deepseek-search-llm-request", "working-directory/change",
    "workspace/changes",
})
