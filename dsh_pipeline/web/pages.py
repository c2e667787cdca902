"""The transcript viewer: server-rendered pages (Jinja2, autoescaped) over
the same reader and tokens as the API. ``/`` lists sessions with the API's
filters; ``/sessions/{id}`` shows one conversation: the request header
(system prompt, tools, model settings) and where in the conversation each
change of it was logged, every derived message (reasoning
folded, tool calls with their arguments, tool results), compaction
summaries marked, token usage per turn, and each finding beside the
message it concerns (the last message at or before the finding's seq).
A browser signs in once on ``/login``; its token is kept in an HttpOnly,
SameSite=Strict cookie.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from consumers.projector.reader import STATUSES, SessionFilter
from dsh_pipeline.transcript import format_time

__all__ = ["add_pages"]

_TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
_FILTERS = ("status", "provider", "model", "cwd", "has_findings", "q")
_LOGIN_BYTES = 8192  # the largest sign-in form read
_TOKEN_COLUMNS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")


_TEMPLATES.env.filters["time"] = format_time
_TEMPLATES.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)


def add_pages(app: FastAPI) -> None:
    from .app import TOKEN_COOKIE

    def signed_in(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else request.cookies.get(TOKEN_COOKIE)
        return app.state.known(token)

    def to_login() -> Response:
        return RedirectResponse("/login", 303)

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    def login_form(request: Request) -> Response:
        return _TEMPLATES.TemplateResponse(request, "login.html", {"failed": False})

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        body = b""
        async for chunk in request.stream():  # at most a token's worth read, whatever the client sends
            body += chunk
            if len(body) > _LOGIN_BYTES:
                return HTMLResponse("the sign-in form is larger than a token", 413)
        form = parse_qs(body.decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0]
        if not app.state.known(token):
            return _TEMPLATES.TemplateResponse(request, "login.html", {"failed": True}, status_code=401)
        response = RedirectResponse("/", 303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return response

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def session_list(request: Request) -> Response:
        if not signed_in(request):
            return to_login()
        given = {name: request.query_params.get(name) or None for name in _FILTERS}
        statuses = tuple(s for s in request.query_params.getlist("status") if s in STATUSES) or None
        findings = {"yes": True, "no": False}.get(given["has_findings"] or "")
        where = SessionFilter(status=statuses, provider=given["provider"], model=given["model"], cwd=given["cwd"],
                              has_findings=findings, text=given["q"])
        page = app.state.read("sessions", where, request.query_params.get("cursor") or None, 50)
        kept = [(name, value) for name, value in request.query_params.multi_items() if name != "cursor" and value]
        more = "/?" + urlencode(kept + [("cursor", page["next"])]) if page["next"] else None
        return _TEMPLATES.TemplateResponse(request, "sessions.html", {
            "sessions": page["items"], "next": more, "given": given, "statuses": STATUSES,
            "chosen": set(statuses or ())})

    @app.get("/sessions/{session_id}", response_class=HTMLResponse, include_in_schema=False)
    def conversation(request: Request, session_id: str) -> Response:
        if not signed_in(request):
            return to_login()
        session = app.state.read("session", session_id)
        if session is None:
            return _TEMPLATES.TemplateResponse(request, "missing.html", {"session_id": session_id}, status_code=404)
        entries, unplaced = conversation_entries(session)
        return _TEMPLATES.TemplateResponse(request, "session.html", {
            "session": session, "entries": entries, "unplaced": unplaced, "turn_usage": turn_usage(session)})


def conversation_entries(session: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each derived message with its seq and the findings it concerns (the
    last message at or before a finding's seq), each request header change
    after the last message before it; and the findings no message precedes."""
    seqs = session["messageSeqs"]
    entries = [{"message": message, "seq": seqs.get(message.get("id")), "findings": [],
                "kind": _kind(message)} for message in session["messages"]]
    placed = sorted((entry["seq"], index) for index, entry in enumerate(entries) if entry["seq"] is not None)
    starts = [seq for seq, _ in placed]

    def last_at_or_before(seq: Any) -> dict[str, Any] | None:
        at = bisect.bisect_right(starts, seq if isinstance(seq, int) else -1) - 1
        return entries[placed[at][1]] if at >= 0 else None

    before = []
    for finding in session["findings"]:
        entry = last_at_or_before(finding["seq"])
        if entry is not None:
            entry["findings"].append(finding)
        else:
            before.append(finding)
    headers = [{"kind": "header", "change": change, "seq": change["seq"], "findings": []}
               for change in session.get("requestHeaderChanges") or ()]
    for header in reversed(headers):  # after the message before it; the first ones ahead of every message
        entry = last_at_or_before(header["seq"])
        entries.insert(next(i + 1 for i, e in enumerate(entries) if e is entry) if entry is not None else 0, header)
    return entries, before


def _kind(message: dict[str, Any]) -> str:
    source = message.get("source") or {}
    kind = source.get("kind")
    if kind == "tool":
        return "tool"
    if kind in ("user", "model"):
        return message.get("role", "user")
    return "other"  # a compaction summary, a runtime's context message


def turn_usage(session: dict[str, Any]) -> list[dict[str, Any]]:
    """Tokens by turn, from the assistant messages on the surface."""
    turns: dict[Any, dict[str, int]] = {}
    for event in session["surface"]:
        data = event["data"]
        if event["type"] == "assistant/message" and isinstance(data, dict) and isinstance(data.get("usage"), dict):
            totals = turns.setdefault(data.get("turn"), dict.fromkeys(_TOKEN_COLUMNS, 0))
            for column in _TOKEN_COLUMNS:
                value = data["usage"].get(column)
                totals[column] += value if isinstance(value, int) and not isinstance(value, bool) else 0
    return [{"turn": turn, **totals} for turn, totals in turns.items()]
