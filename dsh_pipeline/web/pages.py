"""The transcript viewer: server-rendered pages (Jinja2, autoescaped) over
the same reader as the API. ``/`` lists sessions with the API's
filters; ``/findings`` and ``/dead-letters`` list the auditor's findings and
the services' dead letters, newest first, with theirs (a letter's page,
``/dead-letters/{id}``, shows what it kept of its record);
``/sessions/{id}`` shows one conversation, a page of surface
events at a time by seq (:mod:`consumers.projector.session_pages`), long
texts cut to previews, each with a link to its whole message
(``/sessions/{id}?seq=N``): the request header
(system prompt, tools, model settings) and where in the conversation each
change of it was logged, every derived message (reasoning
folded, tool calls with their arguments, tool results), compaction
summaries marked, token usage per turn, and each finding beside the
message it concerns (the last message at or before the finding's seq).

A browser signs in on ``/login`` with a token and gets a signed, expiring
session cookie (:mod:`.browser_sessions`); ``/logout`` ends the session.
Both forms carry a CSRF token, and a POST another site sent is refused
(:func:`~.app.cross_site`). After signing in the browser returns to the page it
came from, if that is a path of this server. Every text a page shows has
its control and bidirectional-formatting characters written as visible
escapes (:func:`visible`), never as they are.
"""

from __future__ import annotations

import bisect
import hmac
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import FastAPI, HTTPException, Path as PathParameter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from consumers.projector.reader import SESSION_ORDERS, STATUSES, DeadLetterFilter, FindingFilter, SessionFilter
from consumers.projector.session_pages import PREVIEW_CHARS
from dsh_core.formats.v4.session import derive_message
from dsh_pipeline.transcript import format_time

from .browser_sessions import client_address, throttled
from .timeline import pretty_json, timeline, tool_results
from .browser_sessions import CSRF_COOKIE, FORM_SECONDS, SESSION_COOKIE, SESSION_SECONDS, SignIn

__all__ = ["add_pages", "visible"]

_TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
_FILTERS = ("status", "provider", "model", "cwd", "has_findings", "q")
_FORM_BYTES = 8192  # the largest form read (sign-in, sign-out)
_ROWS_PER_PAGE = 50  # sessions, findings or dead letters a list shows at a time
_SEVERITIES = ("error", "warning")
_SERVICES = ("projector", "auditor", "archiver")
_TOKEN_COLUMNS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
_EVENTS_PER_PAGE = 50  # a conversation's page: what a browser lays out at once, whatever the session's size
#: C0 and C1 controls but tab and newline, bidirectional and zero-width formatting, line and paragraph
#: separators, the byte-order mark and lone surrogates: what could make a text show other than it is.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069"
                     "\ufeff\ud800-\udfff]")


def visible(value: Any) -> Any:
    """A text with each character of :data:`_HIDDEN` as its escape (``\\u202e``)."""
    if isinstance(value, str):
        return _HIDDEN.sub(lambda found: f"\\u{ord(found.group()):04x}", value)
    return value


_TEMPLATES.env.finalize = visible  # every {{ value }} of every page
_TEMPLATES.env.filters["time"] = format_time
_TEMPLATES.env.filters["ms"] = lambda value: "" if value is None else (
    f"{value / 1000:.1f} s" if abs(value) < 60_000 else f"{value / 60_000:.1f} min" if abs(value) < 3_600_000
    else f"{value / 3_600_000:.1f} h" if abs(value) < 172_800_000 else f"{value / 86_400_000:.0f} days")
_TEMPLATES.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
_TEMPLATES.env.filters["pretty_json"] = pretty_json


def usd(cost: float | None) -> str:
    """A cost in US dollars as a page shows it; ``no price`` for none."""
    if cost is None:
        return "no price"
    return f"${cost:,.2f}" if cost >= 1 else f"${cost:.4f}" if cost >= 0.0001 else "<$0.0001" if cost else "$0"


_TEMPLATES.env.filters["usd"] = usd


def path_segment(text: str) -> str:
    """``text`` as one segment of a URL's path (``/`` encoded too)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


_TEMPLATES.env.filters["path_segment"] = path_segment


def add_pages(app: FastAPI) -> None:
    browsers = app.state.browsers

    def signed_in(request: Request) -> SignIn | None:
        return browsers.of(request.cookies.get(SESSION_COOKIE))

    def to_login(request: Request) -> Response:
        here = request.scope["raw_path"].decode("latin-1") + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": here}), 303)

    def login_page(request: Request, then: str | None, *, failed: bool = False, status: int = 200) -> Response:
        token = browsers.form_token()
        response = _TEMPLATES.TemplateResponse(request, "login.html", {
            "failed": failed, "csrf": token, "next": local_path(then)}, status_code=status)
        _set_cookie(response, request, CSRF_COOKIE, token, FORM_SECONDS)
        return response

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    def login_form(request: Request) -> Response:
        return login_page(request, request.query_params.get("next"))

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        address = client_address(request)
        throttled(browsers, address)
        form = await _form(request)
        if not browsers.form_token_valid(request.cookies.get(CSRF_COOKIE), form.get("csrf")):
            raise HTTPException(403, "the sign-in form expired or was not this server's: reload it and sign in")
        if not app.state.known(form.get("token", "")):
            browsers.failed(address)
            return login_page(request, form.get("next"), failed=True, status=401)
        _, cookie = browsers.start()
        response = RedirectResponse(local_path(form.get("next")), 303)
        _set_cookie(response, request, SESSION_COOKIE, cookie, SESSION_SECONDS)
        response.delete_cookie(CSRF_COOKIE)
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        form = await _form(request)
        session = signed_in(request)
        if session is not None:
            if not hmac.compare_digest(form.get("csrf", "").encode(), session.csrf.encode()):
                raise HTTPException(403, "the sign-out form was not this server's: reload the page and sign out")
            browsers.end(session)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def session_list(request: Request) -> Response:
        if (session := signed_in(request)) is None:
            return to_login(request)
        given = _given(request, _FILTERS)
        statuses = tuple(s for s in request.query_params.getlist("status") if s in STATUSES) or None
        findings = {"yes": True, "no": False}.get(given["has_findings"] or "")
        where = SessionFilter(status=statuses, provider=given["provider"], model=given["model"], cwd=given["cwd"],
                              has_findings=findings, text=given["q"])
        order = _one_of(request.query_params.get("order"), SESSION_ORDERS) or "activity"
        return listing(request, "sessions", where, "sessions.html", session, {"order": order}, given=given,
                       statuses=STATUSES, chosen=set(statuses or ()), orders=SESSION_ORDERS, order=order)

    @app.get("/findings", response_class=HTMLResponse, include_in_schema=False)
    def finding_list(request: Request) -> Response:
        if (session := signed_in(request)) is None:
            return to_login(request)
        given = _given(request, ("rule", "severity", "session"))
        where = FindingFilter(rule=given["rule"], severity=_one_of(given["severity"], _SEVERITIES),
                              session_id=given["session"])
        return listing(request, "findings", where, "findings.html", session, given=given, severities=_SEVERITIES)

    @app.get("/dead-letters", response_class=HTMLResponse, include_in_schema=False)
    def letter_list(request: Request) -> Response:
        if (session := signed_in(request)) is None:
            return to_login(request)
        given = _given(request, ("service", "reason", "session"))
        where = DeadLetterFilter(service=_one_of(given["service"], _SERVICES), reason=given["reason"],
                                 session_id=given["session"])
        return listing(request, "dead_letters", where, "dead_letters.html", session, given=given, services=_SERVICES)

    @app.get("/dead-letters/{letter_id}", response_class=HTMLResponse, include_in_schema=False)
    def letter_page(request: Request, letter_id: int = PathParameter(ge=0, le=2 ** 63 - 1)) -> Response:
        if (session := signed_in(request)) is None:
            return to_login(request)
        letter = app.state.read("dead_letter", letter_id)
        if letter is None:
            return missing(request, f"dead letter {letter_id}", session)
        return _TEMPLATES.TemplateResponse(request, "dead_letter.html", {"letter": letter, "signed_in": session})

    def missing(request: Request, what: str, session: SignIn) -> Response:
        return _TEMPLATES.TemplateResponse(request, "missing.html", {"what": what, "signed_in": session},
                                           status_code=404)

    def listing(request: Request, method: str, where: Any, template: str, session: SignIn,
                options: dict[str, Any] | None = None, **context: Any) -> Response:
        """A page of the reader's ``method`` rows (with its ``options``), with
        the link to the next page keeping the filters given."""
        page = app.state.read(method, where, request.query_params.get("cursor") or None, _ROWS_PER_PAGE,
                              **(options or {}))
        kept = [(name, value) for name, value in request.query_params.multi_items() if name != "cursor" and value]
        more = f"{request.url.path}?" + urlencode(kept + [("cursor", page["next"])]) if page["next"] else None
        return _TEMPLATES.TemplateResponse(request, template, {
            "items": page["items"], "next": more, "signed_in": session, **context})

    @app.get("/timeline/{session_id:path}", response_class=HTMLResponse, include_in_schema=False)
    def session_timeline(request: Request, session_id: str,
                         after: int | None = Query(None, ge=-1, le=2 ** 63 - 1)) -> Response:
        if (signed := signed_in(request)) is None:
            return to_login(request)
        page = app.state.read("session_page", session_id, after, min(_EVENTS_PER_PAGE, app.state.max_page))
        if page is None:
            return missing(request, f"session {session_id}", signed)
        turns, unplaced = timeline(page)
        more = f"/timeline/{path_segment(session_id)}?after={page['next']}" if page["next"] is not None else None
        return _TEMPLATES.TemplateResponse(request, "timeline.html", {
            "session": page, "turns": turns, "unplaced": unplaced, "next": more, "signed_in": signed})

    @app.get("/usage", response_class=HTMLResponse, include_in_schema=False)
    def usage(request: Request) -> Response:
        if (signed := signed_in(request)) is None:
            return to_login(request)
        summary = app.state.read("summary")
        hours = [row | {"tokens": sum(row[column] for column in _TOKEN_COLUMNS)}
                 for row in reversed(summary["tokensByModelPerHour"])]  # newest first
        totals: dict[str, dict[str, Any]] = {}
        for row in hours:
            total = totals.setdefault(row["model"], {"tokens": 0, "costUsd": 0.0})
            total["tokens"] += row["tokens"]
            total["costUsd"] = None if total["costUsd"] is None or row["costUsd"] is None \
                else total["costUsd"] + row["costUsd"]
        return _TEMPLATES.TemplateResponse(request, "usage.html", {
            "hours": hours, "most": max((row["tokens"] for row in hours), default=1) or 1, "totals": totals,
            "prices": summary["prices"], "signed_in": signed})

    @app.get("/sessions/{session_id:path}", response_class=HTMLResponse, include_in_schema=False)
    def conversation(request: Request, session_id: str, after: int | None = Query(None, ge=-1, le=2 ** 63 - 1),
                     seq: int | None = Query(None, ge=0, le=2 ** 63 - 1)) -> Response:
        if (signed := signed_in(request)) is None:
            return to_login(request)
        per_page = min(_EVENTS_PER_PAGE, app.state.max_page) if seq is None else 1  # one event: the facts only
        page = app.state.read("session_page", session_id, after, per_page)
        event = app.state.read("surface_event", session_id, seq) if page is not None and seq is not None else None
        if page is None or (seq is not None and event is None):
            return missing(request, f"surface event at seq {seq} of session {session_id}" if page is not None
                           else f"session {session_id}", signed)
        if event is not None:  # one message whole, as the page showed it cut
            message = derive_message(event["type"], event["data"])
            entry = {"message": message, "seq": seq, "findings": [], "kind": _kind(message)} if message else None
            return _TEMPLATES.TemplateResponse(request, "event.html", {
                "session": page, "event": event, "entry": entry, "signed_in": signed})
        entries, unplaced = conversation_entries(page)
        more = f"/sessions/{path_segment(session_id)}?after={page['next']}" if page["next"] is not None else None
        return _TEMPLATES.TemplateResponse(request, "session.html", {
            "session": page, "entries": entries, "unplaced": unplaced, "results": tool_results(page),
            "next": more, "signed_in": signed, "preview_chars": PREVIEW_CHARS})


def _given(request: Request, names: tuple[str, ...]) -> dict[str, str | None]:
    """The filters of a list page the query gives (an empty one is none)."""
    return {name: request.query_params.get(name) or None for name in names}


def _one_of(value: str | None, allowed: tuple[str, ...]) -> str | None:
    return value if value in allowed else None


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this server (``/...``), else ``/``: a
    sign-in never sends the browser to another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or any(ord(c) < 0x20 or ord(c) == 0x7f for c in target):
        return "/"
    return target


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form: the first value of each field (at most
    :data:`_FORM_BYTES` read, whatever the client sends)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_BYTES:
            raise HTTPException(413, f"the form is larger than {_FORM_BYTES} bytes")
    return {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}


def _set_cookie(response: Response, request: Request, name: str, value: str, seconds: int) -> None:
    response.set_cookie(name, value, max_age=seconds, path="/", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def conversation_entries(session: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each derived message with its seq and the findings it concerns (the
    last message at or before a finding's seq), each request header change
    after the last message before it; and the findings no message precedes."""
    seqs = session["messageSeqs"]
    cut = {event["seq"]: event["preview"] for event in session["surface"] if "preview" in event}
    entries = [{"message": message, "seq": seqs.get(message.get("id")), "findings": [], "kind": _kind(message),
                "preview": cut.get(seqs.get(message.get("id")))} for message in session["messages"]]
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

