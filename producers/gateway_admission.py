"""What the gateway lets through, decided before anything is forwarded: the
client's fleet credential, the path, the session a request names, and
that session's rate.

**Credentials.** Each client of the fleet has a name and a secret, kept in a
file only its owner can read (``NAME SECRET`` per line, ``#`` starts a
comment). A client shows its secret in one of two places, chosen by the
gateway's configuration:

* in :data:`CREDENTIAL_HEADER` (``x-dsh-gateway-credential: SECRET``), a
  header of the gateway's own: the client's ``authorization`` and
  ``x-api-key`` reach the upstream as they came;
* in the model API key slot (``authorization: Bearer SECRET`` or
  ``x-api-key: SECRET``) when the gateway holds the upstream's key itself
  (``upstream_key``): it puts that key in every API key slot the client
  filled (so the credential never reaches the upstream in either). This is
  how dsh runtimes authenticate, since they send no header of their
  choosing; they never hold the upstream's key.

The credential never reaches the upstream, a record or a log line.

**Paths.** A request path is forwarded only if it reads the same before and
after percent-decoding and dot-segment removal (no ``.``/``..``/empty
segment, no encoded ``/`` or ``\\``, nothing encoded twice), so it never
leaves the upstream URL's path prefix and a model path cannot hide in
another spelling; then only a model API request (``POST …/chat/completions``,
``POST …/messages``: attested) or a ``GET`` (the model catalog: forwarded,
not attested) is forwarded. Anything else is refused (:class:`Refusal`).

**Session ids.** dsh runtimes are Node programs whose ``fetch`` sends a
header value's characters as Latin-1 bytes (and cannot send one above
U+00FF); other clients send UTF-8. A session id is read as UTF-8 when its
bytes are UTF-8, as Latin-1 otherwise, so both reach the attestation key as
the agent named them.
"""

from __future__ import annotations

import hmac
import os
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Mapping
from urllib.parse import unquote

from dsh_core.errors import PipelineError
from dsh_core.wire_request import Wire
from dsh_kafka.config import Secret

from .errors import ExposedSecretError

__all__ = ["BodyMemory", "CREDENTIAL_HEADER", "Credentials", "Refusal", "SessionRates", "classify_path",
           "read_secret_file", "session_id_of"]

CREDENTIAL_HEADER = "x-dsh-gateway-credential"


class Refusal(Exception):
    """A request the gateway answers itself with ``status``, forwarding nothing."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def read_secret_file(path: str | Path, what: str) -> str:
    """The text of a secret file that only its owner may read or write:
    :class:`ExposedSecretError` when its group or others may, a
    :class:`PipelineError` naming ``what`` and the path when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as file:
            mode = os.fstat(file.fileno()).st_mode  # of the file read, not of what the path names later
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ExposedSecretError(f"{what} {path}: its group or others may read or change it (mode "
                                         f"{stat.S_IMODE(mode):04o}): run `chmod 600 {path}`")
            return file.read()
    except (OSError, UnicodeError) as error:
        raise PipelineError(f"{what} {path}: cannot read it: {getattr(error, 'strerror', None) or error}") from None


@dataclass(frozen=True)
class Credentials:
    """The fleet's clients: each name's secret."""

    secrets: Mapping[str, Secret]

    @classmethod
    def from_file(cls, path: str | Path) -> "Credentials":
        """``NAME SECRET`` per line; a secret of fewer than 16 characters, a
        repeated name or a line of another shape is refused naming its line."""
        secrets: dict[str, Secret] = {}
        for number, line in enumerate(read_secret_file(path, "the credentials file").splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2 or len(fields[1]) < 16 or fields[0] in secrets:
                why = ("is not NAME SECRET" if len(fields) != 2 else "repeats a name" if fields[0] in secrets
                       else "has a secret of fewer than 16 characters")
                raise PipelineError(f"the credentials file {path}, line {number}: {why}")
            secrets[fields[0]] = Secret(fields[1])
        if not secrets:
            raise PipelineError(f"the credentials file {path} names no client (NAME SECRET per line)")
        return cls(secrets)

    def client(self, presented: str) -> str | None:
        """The client whose secret was presented, compared in constant time."""
        found = None
        for name, secret in self.secrets.items():
            if hmac.compare_digest(presented.encode(), secret.reveal().encode()):
                found = name
        return found

    def authenticate(self, headers: list[tuple[str, str]], upstream_key: Secret | None
                     ) -> tuple[str, list[tuple[str, str]]]:
        """The client that ``headers`` (lower-case names) authenticate and the
        headers to forward: the credential taken out, and with
        ``upstream_key``, that key put in every API key slot the client
        filled. :class:`Refusal` 401 if they authenticate none."""
        named = dict(headers)
        if upstream_key is None:
            presented = [named.get(CREDENTIAL_HEADER, "")]
        else:
            scheme, _, token = named.get("authorization", "").partition(" ")
            presented = [token if scheme.lower() == "bearer" else "", named.get("x-api-key", "")]
        client = next((found for secret in presented if secret.strip() and (found := self.client(secret.strip()))),
                      None)
        if client is None:
            where = CREDENTIAL_HEADER if upstream_key is None else "authorization: Bearer or x-api-key"
            raise Refusal(401, f"no valid fleet credential in {where}")
        forwarded = [(name, value) for name, value in headers if name != CREDENTIAL_HEADER]
        if upstream_key is not None:
            keys = {"authorization": "Bearer " + upstream_key.reveal(), "x-api-key": upstream_key.reveal()}
            forwarded = [(name, keys.get(name, value)) for name, value in forwarded]
        return client, forwarded


def _segments_unchanged(raw: str) -> str:
    """The decoded path, if decoding and dot-segment removal leave its
    segments as they are; :class:`Refusal` 400 naming what would change."""
    if not raw.startswith("/"):
        raise Refusal(400, "the request path is not absolute")
    decoded = []
    for segment in raw[1:].split("/"):
        try:
            text = unquote(segment, errors="strict")
        except UnicodeDecodeError:
            raise Refusal(400, f"the path segment {segment!r} is not UTF-8 once decoded") from None
        if text in ("", ".", "..") or any(c in text for c in "/\\%") or not text.isprintable():
            raise Refusal(400, f"the path segment {segment!r} would change under normalization (an empty, dot, "
                               f"encoded-slash, twice-encoded or control-character segment): not forwarded")
        decoded.append(text)
    return "/" + "/".join(decoded)


def classify_path(method: str, raw_path: bytes) -> Wire | Literal["catalog"]:
    """What a request to ``raw_path`` is: a model API request of a wire
    (attested), or a ``GET`` (forwarded as it is); :class:`Refusal` otherwise."""
    try:
        path = _segments_unchanged(raw_path.decode("ascii"))
    except UnicodeDecodeError:
        raise Refusal(400, "the request path holds bytes that are not ASCII") from None
    if method == "POST" and path.endswith("/chat/completions"):
        return "chat-completions"
    if method == "POST" and path.endswith("/messages"):
        return "messages"
    if method == "GET":
        return "catalog"
    raise Refusal(404, f"{method} {path} is not a model API request (POST …/chat/completions or …/messages) "
                       "nor a GET: not forwarded")


def session_id_of(raw: bytes) -> str:
    """A session header's value as the agent named it: UTF-8 when its bytes
    are, otherwise Latin-1 (what a Node ``fetch`` sends)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class SessionRates:
    """A token bucket per session id: ``rate`` requests a second, ``burst`` at
    once. At most ``capacity`` ids are kept; beyond, the least recently seen
    is forgotten (a forgotten id starts again with a full bucket)."""

    def __init__(self, rate: float, burst: float, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.capacity, self.clock = rate, burst, capacity, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # id -> (tokens, when)

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, session_id: str) -> bool:
        now = self.clock()
        tokens, then = self._buckets.pop(session_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        allowed = tokens >= 1
        self._buckets[session_id] = (tokens - allowed, now)
        if len(self._buckets) > self.capacity:
            self._buckets.popitem(last=False)
        return allowed


class BodyMemory:
    """The bytes of request bodies the gateway holds (being read, forwarded
    or waiting to be attested): at most ``limit``, and shared so that no
    client of the fleet can hold all of it. A client holding more than half
    of it takes more only while a quarter stays free: however many bodies
    one client declares and holds back, another finds at least a quarter
    of the memory for its own."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._clients: dict[str, int] = {}  # bytes each client holds (a fleet's credentials: a bounded set)

    def take(self, client: str, size: int) -> bool:
        """Count ``size`` more bytes held for ``client``, if that stays
        within the limit and the client's share."""
        mine = self._clients.get(client, 0) + size
        if self.held + size > self.limit or (mine > self.limit // 2 and
                                             self.held + size > self.limit - self.limit // 4):
            return False
        self.held += size
        self._clients[client] = mine
        return True

    def give(self, client: str, size: int) -> None:
        self.held -= size
        mine = self._clients.pop(client, 0) - size
        if mine:
            self._clients[client] = mine
