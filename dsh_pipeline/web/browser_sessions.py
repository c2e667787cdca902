"""Browser sign-in for the viewer: signed, expiring session cookies distinct
from the API tokens, a CSRF token for every form, and sign-in throttling.

* A signed-in browser holds a session id signed with itsdangerous (HMAC with
  a key made at start-up, so a restart signs every browser out) and dated:
  older than :data:`SESSION_SECONDS` it is refused. The server keeps the ids
  it gave (at most :data:`MAX_SESSIONS`, the oldest signed out first), so
  signing out ends a session for good, even for a copy of its cookie.
* Each form carries a CSRF token (hidden field), checked on POST against
  the one the browser holds: the sign-in form's in a cookie of its own
  (signed, dated), a session's kept beside its id.
* Failed sign-ins (form or bearer token) are counted per client address in
  a fixed window; beyond :data:`MAX_FAILURES` per :data:`FAILURE_WINDOW`
  seconds the address is refused (429) until the window ends. At most
  :data:`MAX_ADDRESSES` addresses are remembered (the least recent forgotten).
"""

from __future__ import annotations

import collections
import hmac
import math
import secrets
import time
from dataclasses import dataclass
from typing import Callable

from fastapi import HTTPException, Request
from itsdangerous import BadSignature, URLSafeTimedSerializer

__all__ = ["BrowserSessions", "SignIn", "SESSION_COOKIE", "CSRF_COOKIE", "client_address", "throttled"]

#: The signed session id of a signed-in browser (HttpOnly, SameSite=Strict).
SESSION_COOKIE = "dsh_session"
#: The sign-in form's CSRF token, before there is a session.
CSRF_COOKIE = "dsh_csrf"
SESSION_SECONDS = 12 * 3600
FORM_SECONDS = 3600  # how long a sign-in form stays usable
MAX_SESSIONS = 10_000
MAX_FAILURES = 5
FAILURE_WINDOW = 60.0
MAX_ADDRESSES = 10_000


@dataclass(frozen=True)
class SignIn:
    """A signed-in browser: its session id and the CSRF token of its forms."""

    session_id: str
    csrf: str


class BrowserSessions:
    """The signed-in browsers of one server, and the throttle of its sign-ins."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.time
        key = secrets.token_bytes(32)
        self._sessions = URLSafeTimedSerializer(key, salt="dsh-viewer-session")
        self._forms = URLSafeTimedSerializer(key, salt="dsh-viewer-sign-in-form")
        self._live: collections.OrderedDict[str, str] = collections.OrderedDict()  # session id -> CSRF token
        self._failures: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    # ------------------------------------------------------------- sessions

    def start(self) -> tuple[SignIn, str]:
        """A new session and the cookie value that names it."""
        signed_in = SignIn(secrets.token_urlsafe(24), secrets.token_urlsafe(24))
        self._live[signed_in.session_id] = signed_in.csrf
        while len(self._live) > MAX_SESSIONS:
            self._live.popitem(last=False)
        return signed_in, self._sessions.dumps(signed_in.session_id)

    def of(self, cookie: str | None) -> SignIn | None:
        """The live session a cookie names (``None``: none, forged, expired or signed out)."""
        session_id = self._load(self._sessions, cookie, SESSION_SECONDS)
        if not isinstance(session_id, str):
            return None
        csrf = self._live.get(session_id)
        return SignIn(session_id, csrf) if csrf is not None else None

    def end(self, signed_in: SignIn) -> None:
        self._live.pop(signed_in.session_id, None)

    # ----------------------------------------------------------------- CSRF

    def form_token(self) -> str:
        """A fresh CSRF token for the sign-in form (its cookie and its hidden field)."""
        return self._forms.dumps(secrets.token_urlsafe(24))

    def form_token_valid(self, cookie: str | None, field: str | None) -> bool:
        """Whether the form's field repeats the browser's (unexpired) cookie."""
        if not cookie or not field or not hmac.compare_digest(cookie.encode(), field.encode()):
            return False
        return self._load(self._forms, cookie, FORM_SECONDS) is not None

    def _load(self, serializer: URLSafeTimedSerializer, value: str | None, max_age: int) -> object | None:
        if not value:
            return None
        try:
            return serializer.loads(value, max_age=max_age)
        except BadSignature:  # forged, altered or expired (SignatureExpired is a BadSignature)
            return None

    # ------------------------------------------------------------- throttle

    def throttled_for(self, address: str) -> float:
        """Seconds until ``address`` may try to sign in again (0: now)."""
        start, failures = self._failures.get(address, (0.0, 0))
        left = start + FAILURE_WINDOW - self._clock()
        return left if failures >= MAX_FAILURES and left > 0 else 0.0

    def failed(self, address: str) -> None:
        """Count a failed sign-in of ``address``."""
        now = self._clock()
        start, failures = self._failures.pop(address, (now, 0))
        self._failures[address] = (start, failures + 1) if now - start < FAILURE_WINDOW else (now, 1)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def throttled(browsers: BrowserSessions, address: str) -> None:
    """A 429 while ``address`` has failed to sign in too often."""
    wait = math.ceil(browsers.throttled_for(address))
    if wait:
        raise HTTPException(429, f"too many failed sign-ins from {address}: try again in {wait} s",
                            headers={"Retry-After": str(wait)})
