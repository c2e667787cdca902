"""The read API: the view store over HTTP, read-only, behind bearer tokens.

``read_api(reader, tokens)`` is an ASGI app (FastAPI) serving JSON under
``/api/v1`` and the transcript viewer's pages (:mod:`.pages`). Every route
but ``/healthz``, the sign-in page and the viewer's stylesheet needs a token
of ``tokens`` as ``Authorization: Bearer <token>``, or, for a browser, the
signed session cookie signing in gives (:mod:`.browser_sessions`): the
OpenAPI document ``/api/v1/openapi.json`` too (there is no docs page: it
would load its script from a CDN). Tokens are compared in constant time and
never logged; failed ones are throttled per client address like failed
sign-ins. CORS is off unless origins are given. Every response carries a
strict Content-Security-Policy (nothing but the package's own stylesheet
and images; no script at all), forbids framing and MIME sniffing, sends no
referrer, and is not stored by caches (:data:`SECURITY_HEADERS`).

A malformed parameter is a 422 whose ``error`` names it; an unknown
session or dead letter a 404 naming it. The reader is called from
FastAPI's thread pool, one call at a time (its connection is not shared
between threads).
"""

from __future__ import annotations

import hmac
import json
import threading
from typing import Any, Callable, Literal
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from pathlib import Path as FilePath
from starlette.exceptions import HTTPException as StarletteHTTPException

from consumers.runtime.errors import StateStoreError
from dsh_pipeline.prices import PriceTable, load_prices
from producers.http_limits import ListenerLimits
from .browser_sessions import SESSION_COOKIE, BrowserSessions, client_address, throttled
from consumers.projector.reader import (SESSION_ORDERS, STATUSES, DeadLetterFilter, FindingFilter, SessionFilter,
                                       ViewReader)

__all__ = ["API_LIMITS", "SECURITY_HEADERS", "read_api"]

#: What ``serve``'s listener holds its clients to (:mod:`producers.http_limits`).
API_LIMITS = ListenerLimits(request_seconds=10.0, idle_seconds=5, max_connections=512, max_head_bytes=32 * 1024)

#: The longest query string taken (a request is no place for a document).
MAX_QUERY_BYTES = 4096
_TEXT = 512  # the longest text filter
#: A time in ms: what the stores' 64-bit integer columns hold (beyond, a 422, not an overflow in the store)
Status = Literal[STATUSES]  # type: ignore[valid-type]
Order = Literal[SESSION_ORDERS]  # type: ignore[valid-type]
#: On every response: the pages load nothing but the package's stylesheet, run no script, post forms
#: only to this origin, are never framed, sniffed, stored or followed by a referrer.
SECURITY_HEADERS = (
    (b"content-security-policy", b"default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                 b"frame-ancestors 'none'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


class _Json(JSONResponse):
    """JSON as UTF-8; a text UTF-8 cannot hold (a lone surrogate, which
    dsh's lossless JSON keeps) makes the whole answer ``\\u``-escaped
    ASCII, the same value, rather than a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


class _Guarded:
    """The reader, one call at a time, its usage rows priced."""

    def __init__(self, reader: ViewReader, prices: PriceTable) -> None:
        self.reader, self.prices, self.lock = reader, prices, threading.Lock()

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "sessions":  # the store costs the sessions it lists, so it can order them by cost
            kwargs["prices"] = self.prices.prices
        with self.lock:
            try:
                answer = getattr(self.reader, method)(*args, **kwargs)
            except StateStoreError as error:  # the store is down: the API is not
                raise HTTPException(503, error.message) from None
            except ValueError as error:  # a cursor the store never gave
                raise HTTPException(422, f"query parameter 'cursor': {error}") from None
        return self._priced(method, answer)

    def _priced(self, method: str, answer: Any) -> Any:
        """Each usage row of a sessions page, a session or the summary with
        its cost in US dollars (``costUsd``: null for a model without a
        price), and a session's, a turn's and a step's cost: the sum of its
        rows' (null when one of them has no price; 0 with no model row)."""
        def priced(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [row | {"costUsd": self.prices.cost(row.get("provider"), row.get("model"), row)} for row in rows]

        def total(rows: list[dict[str, Any]]) -> dict[str, Any]:
            costs = [row["costUsd"] for row in rows if row.get("model") is not None]
            return {"costUsd": None if None in costs else round(sum(costs), 6)}

        def session(item: dict[str, Any]) -> dict[str, Any]:
            models = priced(item.get("models") or [])
            return item | {"models": models, **total(models)}

        if method == "sessions":  # each session's cost as the store ordered them by
            return answer | {"items": [item | {"models": priced(item.get("models") or [])}
                                       for item in answer["items"]]}
        if method == "session_page" and answer is not None:
            steps = priced(answer.get("steps") or [])
            turns = [turn | total([step for step in steps if step["turn"] == turn.get("turn")])
                     for turn in answer.get("turns") or []]
            return session(answer) | {"steps": steps, "turns": turns}
        if method == "summary":
            return answer | {"tokensByModelPerHour": priced(answer["tokensByModelPerHour"]),
                             "prices": {"taken": self.prices.taken.isoformat(), "source": self.prices.source}}
        return answer



def _ms() -> Any:
    """An optional query parameter holding a time in ms since the epoch (a signed 64-bit integer)."""
    return Query(None, ge=-(2 ** 63), le=2 ** 63 - 1)

def read_api(reader: ViewReader, tokens: frozenset[str], *, cors_origins: tuple[str, ...] = (),
             max_page: int = 200, browsers: BrowserSessions | None = None,
             prices: PriceTable | None = None) -> FastAPI:
    """The API and the viewer over ``reader``; ``browsers`` keeps the
    signed-in browsers and the sign-in throttle (a new one by default);
    ``prices`` prices usage (the packaged table by default)."""
    if not tokens or not all(tokens):
        raise ValueError("the read API needs at least one non-empty token")
    app = FastAPI(title="dsh-pipeline read API", version="1", openapi_url=None, docs_url=None, redoc_url=None,
                  default_response_class=_Json)
    read = _Guarded(reader, prices or load_prices())
    secrets = [token.encode() for token in tokens]
    browsers = browsers or BrowserSessions()

    def known(token: str) -> bool:
        given = token.encode()
        return any([hmac.compare_digest(given, secret) for secret in secrets])  # every one compared: no timing

    def authorized(request: Request) -> None:
        """A token of this service (bearer), or a signed-in browser's cookie."""
        address = client_address(request)
        throttled(browsers, address)
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() == "bearer" and known(token.strip()):
                return
            browsers.failed(address)
        elif browsers.of(request.cookies.get(SESSION_COOKIE)) is not None:
            return
        raise HTTPException(401, "a bearer token of this service is required (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})

    app.state.read, app.state.known, app.state.max_page, app.state.browsers = read, known, max_page, browsers
    _errors(app)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET"],
                           allow_headers=["Authorization"])
    app.middleware("http")(_limit_query)
    app.add_middleware(_SecurityHeaders)
    guard = [Depends(authorized)]
    limit = Query(50, ge=1, le=max_page, description=f"items per page (1 to {max_page})")

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/sessions", dependencies=guard,
             summary="sessions, most recently active first (or by creation, tokens or cost: `order`)")
    def sessions(status: list[Status] | None = Query(None), provider: str | None = Query(None, max_length=_TEXT),
                 model: str | None = Query(None, max_length=_TEXT), cwd: str | None = Query(None, max_length=_TEXT),
                 created_from: int | None = _ms(), created_to: int | None = _ms(),
                 active_from: int | None = _ms(), active_to: int | None = _ms(),
                 has_findings: bool | None = None,
                 q: str | None = Query(None, max_length=_TEXT, description="text in a current message"),
                 cursor: str | None = Query(None, max_length=_TEXT), limit: int = limit,
                 order: Order = Query("activity", description="listed by this, descending")) -> dict[str, Any]:
        where = SessionFilter(status=tuple(status) if status else None, provider=provider, model=model, cwd=cwd,
                              created_from=created_from, created_to=created_to, active_from=active_from,
                              active_to=active_to, has_findings=has_findings, text=q or None)
        return read("sessions", where, cursor, limit, order=order)

    @app.get("/api/v1/sessions/{session_id:path}", dependencies=guard,
             summary="one session: header, turns, totals, and a page of its surface events by seq with their "
                     "derived messages (dsh's), header changes and findings; long texts as previews")
    def session(session_id: str,
                after: int | None = Query(None, ge=-1, le=2 ** 63 - 1,
                                          description="the page after this seq (the last page's `next`)"),
                limit: int = Query(max_page, ge=1, le=max_page, description=f"events per page (1 to {max_page})"),
                ) -> dict[str, Any]:
        found = read("session_page", session_id, after, limit)
        if found is None:
            raise HTTPException(404, f"no session {session_id!r} in the view store")
        return found

    @app.get("/api/v1/events/{seq}", dependencies=guard,
             summary="one surface event of a session whole (a page shows long texts cut)")
    def surface_event(seq: int = Path(ge=0, le=2 ** 63 - 1),
                      session: str = Query(max_length=_TEXT, description="the session's id")) -> dict[str, Any]:
        found = read("surface_event", session, seq)
        if found is None:
            raise HTTPException(404, f"no surface event at seq {seq} of session {session!r} in the view store")
        return found

    @app.get("/api/v1/findings", dependencies=guard, summary="the auditor's findings, newest first")
    def findings(rule: str | None = Query(None, max_length=_TEXT),
                 severity: Literal["error", "warning"] | None = None,
                 session: str | None = Query(None, max_length=_TEXT), since: int | None = _ms(),
                 until: int | None = _ms(), cursor: str | None = Query(None, max_length=_TEXT),
                 limit: int = limit) -> dict[str, Any]:
        return read("findings", FindingFilter(rule=rule, severity=severity, session_id=session, since=since,
                                              until=until), cursor, limit)

    @app.get("/api/v1/dead-letters", dependencies=guard, summary="the services' dead letters, newest first")
    def dead_letters(service: Literal["projector", "auditor", "archiver"] | None = None,
                     reason: str | None = Query(None, max_length=_TEXT),
                     session: str | None = Query(None, max_length=_TEXT),
                     cursor: str | None = Query(None, max_length=_TEXT), limit: int = limit) -> dict[str, Any]:
        return read("dead_letters", DeadLetterFilter(service=service, reason=reason, session_id=session), cursor,
                    limit)

    @app.get("/api/v1/dead-letters/{letter_id}", dependencies=guard, summary="one dead letter")
    def dead_letter(letter_id: int = Path(ge=0, le=2 ** 63 - 1)) -> dict[str, Any]:
        found = read("dead_letter", letter_id)
        if found is None:
            raise HTTPException(404, f"no dead letter {letter_id} in the view store")
        return found

    @app.get("/api/v1/openapi.json", dependencies=guard, include_in_schema=False)
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/api/v1/summary", dependencies=guard,
             summary="sessions by status, tokens and their cost by model per hour, and where the prices come from")
    def summary() -> dict[str, Any]:
        return read("summary")

    from .pages import add_pages
    add_pages(app)
    app.mount("/static", StaticFiles(directory=FilePath(__file__).parent / "static"), name="static")
    return app


def _errors(app: FastAPI) -> None:
    """Errors as ``{"error": ...}``; a validation error names its parameter."""

    @app.exception_handler(StarletteHTTPException)  # FastAPI's and the router's own (404, 405)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": error.detail}, error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = []
        for problem in error.errors():
            where = [str(part) for part in problem.get("loc", ())]
            kind = {"query": "query parameter", "path": "path parameter"}.get(where[0] if where else "", "parameter")
            problems.append(f"{kind} {'.'.join(where[1:2]) or '?'!r}: {problem.get('msg')}")
        return JSONResponse({"error": "; ".join(problems)}, 422)


async def _limit_query(request: Request, call_next: Callable) -> Any:
    if len(request.scope.get("query_string", b"")) > MAX_QUERY_BYTES:
        return JSONResponse({"error": f"the query string is longer than {MAX_QUERY_BYTES} bytes"}, 414)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        if request.url.path not in _FORMS:
            return JSONResponse({"error": "this API is read-only"}, 405)
        if cross_site(request):
            return JSONResponse({"error": f"a form of another site posted to {request.url.path}: refused"}, 403)
    return await call_next(request)


def cross_site(request: Request) -> bool:
    """Whether another site sent this request, as the browser says
    (``Sec-Fetch-Site``), or, from a browser too old to say, as its
    ``Origin`` shows (``null`` included: under ``no-referrer`` a browser
    that does send ``Sec-Fetch-Site`` sends that even from this site)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != request.headers.get("host", "")


#: The forms the viewer posts (the only requests that are not reads).
_FORMS = ("/login", "/logout")


class _SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response (an ASGI middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)
