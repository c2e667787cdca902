"""The read API: the view store over HTTP, read-only, behind bearer tokens.

``read_api(reader, tokens)`` is an ASGI app (FastAPI) serving JSON under
``/api/v1`` and the transcript viewer's pages (:mod:`.pages`). Every route
but ``/healthz`` and the login page needs a token of ``tokens``: as
``Authorization: Bearer <token>``, or, for a browser, the cookie the login
page sets. Tokens are compared in constant time and never logged. CORS is
off unless origins are given. The OpenAPI document is ``/api/v1/openapi.json``.

A malformed parameter is a 422 whose ``error`` names it; an unknown
session or dead letter a 404 naming it. The reader is called from
FastAPI's thread pool, one call at a time (its connection is not shared
between threads).
"""

from __future__ import annotations

import hmac
import threading
from typing import Any, Callable, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from pathlib import Path as FilePath
from starlette.exceptions import HTTPException as StarletteHTTPException

from dsh_core.errors import StateStoreError
from consumers.projector.reader import STATUSES, DeadLetterFilter, FindingFilter, SessionFilter, ViewReader

__all__ = ["TOKEN_COOKIE", "read_api"]

#: The cookie a browser keeps its token in (HttpOnly, SameSite=Strict).
TOKEN_COOKIE = "dsh_token"
#: The longest query string taken (a request is no place for a document).
MAX_QUERY_BYTES = 4096
_TEXT = 512  # the longest text filter
#: A time in ms: what the stores' 64-bit integer columns hold (beyond, a 422, not an overflow in the store)
_MS = {"ge": -(2 ** 63), "le": 2 ** 63 - 1}
Status = Literal[STATUSES]  # type: ignore[valid-type]


class _Guarded:
    """The reader, one call at a time."""

    def __init__(self, reader: ViewReader) -> None:
        self.reader, self.lock = reader, threading.Lock()

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            try:
                return getattr(self.reader, method)(*args, **kwargs)
            except StateStoreError as error:  # the store is down: the API is not
                raise HTTPException(503, error.message) from None
            except ValueError as error:  # a cursor the store never gave
                raise HTTPException(422, f"query parameter 'cursor': {error}") from None


def read_api(reader: ViewReader, tokens: frozenset[str], *, cors_origins: tuple[str, ...] = (),
             max_page: int = 200) -> FastAPI:
    if not tokens or not all(tokens):
        raise ValueError("the read API needs at least one non-empty token")
    app = FastAPI(title="dsh-pipeline read API", version="1", openapi_url="/api/v1/openapi.json",
                  docs_url="/api/v1/docs", redoc_url=None)
    read = _Guarded(reader)
    secrets = [token.encode() for token in tokens]

    def token_of(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip()
        return request.cookies.get(TOKEN_COOKIE)

    def known(token: str | None) -> bool:
        given = (token or "").encode()
        return any([hmac.compare_digest(given, secret) for secret in secrets])  # every one compared: no timing

    def authorized(request: Request) -> None:
        if not known(token_of(request)):
            raise HTTPException(401, "a bearer token of this service is required (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})

    app.state.read, app.state.known, app.state.max_page = read, known, max_page
    _errors(app)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET"],
                           allow_headers=["Authorization"])
    app.middleware("http")(_limit_query)
    guard = [Depends(authorized)]
    limit = Query(50, ge=1, le=max_page, description=f"items per page (1 to {max_page})")

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/v1/sessions", dependencies=guard, summary="sessions, most recently active first")
    def sessions(status: list[Status] | None = Query(None), provider: str | None = Query(None, max_length=_TEXT),
                 model: str | None = Query(None, max_length=_TEXT), cwd: str | None = Query(None, max_length=_TEXT),
                 created_from: int | None = Query(None, **_MS), created_to: int | None = Query(None, **_MS),
                 active_from: int | None = Query(None, **_MS), active_to: int | None = Query(None, **_MS),
                 has_findings: bool | None = None,
                 q: str | None = Query(None, max_length=_TEXT, description="text in a current message"),
                 cursor: str | None = Query(None, max_length=_TEXT), limit: int = limit) -> dict[str, Any]:
        where = SessionFilter(status=tuple(status) if status else None, provider=provider, model=model, cwd=cwd,
                              created_from=created_from, created_to=created_to, active_from=active_from,
                              active_to=active_to, has_findings=has_findings, text=q or None)
        return read("sessions", where, cursor, limit)

    @app.get("/api/v1/sessions/{session_id}", dependencies=guard,
             summary="one session: header, turns, usage, derived messages (dsh's), surface, findings")
    def session(session_id: str) -> dict[str, Any]:
        found = read("session", session_id)
        if found is None:
            raise HTTPException(404, f"no session {session_id!r} in the view store")
        return found

    @app.get("/api/v1/findings", dependencies=guard, summary="the auditor's findings, newest first")
    def findings(rule: str | None = Query(None, max_length=_TEXT),
                 severity: Literal["error", "warning"] | None = None,
                 session: str | None = Query(None, max_length=_TEXT), since: int | None = Query(None, **_MS),
                 until: int | None = Query(None, **_MS), cursor: str | None = Query(None, max_length=_TEXT),
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

    @app.get("/api/v1/summary", dependencies=guard, summary="sessions by status, tokens by model per hour")
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
    if request.method not in ("GET", "HEAD", "OPTIONS") and request.url.path != "/login":
        return JSONResponse({"error": "this API is read-only"}, 405)
    return await call_next(request)
