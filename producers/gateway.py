"""The attesting model gateway: a reverse proxy for the model APIs dsh speaks.

dsh agents reach it by pointing ``DEEPSEEK_BASE_URL`` at it. A request is
let through only from a client of the fleet, on a path that is a model API
request or a ``GET``, within the body, time and per-session rate limits
(:mod:`producers.gateway_admission`); anything else is answered by the
gateway itself (401, 400/404, 413, 408, 429, 503) and reaches no upstream.
A request let through is forwarded unchanged (but for the fleet credential,
taken out, and a ``rewrite`` hook, whose changes are attested like any
other content) and the response is streamed back unchanged, byte for byte
and chunk by chunk. Credentials and API keys are never logged, stored or
published.

For every model API request (``POST …/chat/completions``, ``…/messages``)
that names its session (``x-deepseek-harness-session-id``) it publishes a
wire attestation on the session's key once the exchange is over
(:func:`dsh_kafka.records.wire_attestation_record`): which gateway, client
and arrival, the wire, its classification (an agent step, a session title,
a compaction summary), the upstream status and how the exchange ended
(``refused`` when the upstream answered 401 or 403: the model saw
nothing), and the digest and parts of the request's ``dsh-request/1`` form
(:mod:`dsh_core.wire_request`), read off the event loop but for a small body
(:mod:`producers.gateway_attest`). The auditor matches it to the request
boundary of the log.

The ASGI app is served by uvicorn (:class:`~producers.asgi_server.AsgiServer`);
aiohttp is the upstream client.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
from prometheus_client import Counter, Gauge, Histogram

from dsh_core.wire_request import Wire
from dsh_kafka.config import Secret

from .gateway_admission import BodyMemory, Credentials, Refusal, SessionRates, classify_path, session_id_of
from .gateway_attest import REQUESTS, Attest, Attesting, Exchange
from .http_limits import ListenerLimits

__all__ = ["Gateway", "GatewayConfig", "LISTENER_LIMITS", "SESSION_HEADER"]

#: The gateway's listener: a request head within 10 s; the body within
#: ``GatewayConfig.body_timeout`` (answered 408 by the gateway itself, well
#: before this deadline); a model client's keep-alive; room for a fleet.
LISTENER_LIMITS = ListenerLimits(head_seconds=10.0, request_seconds=3600.0, idle_seconds=75, max_connections=1024)

log = logging.getLogger("dsh_pipeline.gateway")

SESSION_HEADER = "x-deepseek-harness-session-id"
COMPACT_HEADER = "x-deepseek-harness-compact"
#: Hop-by-hop headers (RFC 9110 §7.6.1) and those the client library sets itself.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                            "transfer-encoding", "upgrade", "host", "content-length"})
_RESPONSE_NOT_FORWARDED = _NOT_FORWARDED - {"content-length"}
_REFUSED_BY_UPSTREAM = frozenset({401, 403})
_WRITTEN_AT_ONCE = 1 << 20

FIRST_BYTE = Histogram("dsh_gateway_upstream_first_byte_seconds", "Upstream time to response headers.",
                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
STREAMS = Gauge("dsh_gateway_streams", "Responses being streamed now.")
REFUSED = Counter("dsh_gateway_refusals_total", "Requests the gateway answered itself without forwarding, by status.",
                  ["status"])
SESSIONS = Gauge("dsh_gateway_sessions_kept", "Session ids whose request rate the gateway keeps.")
BODY_BYTES = Gauge("dsh_gateway_body_bytes", "Bytes of request bodies the gateway holds.")

Rewrite = Callable[[Wire, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    upstream: str  # the fleet's model endpoint, as its DEEPSEEK_BASE_URL would be
    credentials: Credentials  # the fleet's clients (see producers.gateway_admission)
    upstream_key: Secret | None = None  # when set, clients show their credential in the API key slot
    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # the longest silence of an upstream stream before it counts as stalled
    body_timeout: float = 60.0  # a request body arrives within this many seconds, or 408
    max_body_bytes: int = 32 * 1024 * 1024  # a larger body is refused (413)
    body_memory_bytes: int = 256 * 1024 * 1024  # bodies held at once; a request beyond is refused (503)
    inline_read_bytes: int = 2 * 1024  # a body this small is read on the event loop (0.5 ms at most, of tiny messages)
    parse_limit_bytes: int = 8 * 1024 * 1024  # a larger body is attested by the digest of its bytes, ...
    attest_queue_bytes: int = 64 * 1024 * 1024  # ... and so is one finding this many waiting to be read
    attest_workers: int = 2
    session_rate: float = 10.0  # requests a second per session id, ...
    session_burst: float = 30.0  # ... this many at once
    sessions_kept: int = 10_000  # session ids whose rate is kept (least recently seen forgotten)
    instance: str = ""  # names this gateway in its attestations (default host:pid)


class Gateway:
    """The ASGI app. ``attest`` publishes a finished exchange's record."""

    def __init__(self, config: GatewayConfig, attest: Attest, rewrite: Rewrite | None = None) -> None:
        self.config = config
        self.rewrite = rewrite
        self.instance = config.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.upstream = config.upstream.rstrip("/")
        self._arrivals = itertools.count(1)
        self._rates = SessionRates(config.session_rate, config.session_burst, config.sessions_kept)
        self._memory = BodyMemory(config.body_memory_bytes)
        # read when scraped, not set at every change: two gauges fewer to set per request
        SESSIONS.set_function(lambda: len(self._rates))
        BODY_BYTES.set_function(lambda: self._memory.held)
        self._attesting = Attesting(self.instance, attest, workers=config.attest_workers,
                                    inline_limit=config.inline_read_bytes, parse_limit=config.parse_limit_bytes,
                                    queue_bytes=config.attest_queue_bytes, release=self._memory.give)
        self._client: aiohttp.ClientSession | None = None

    def _upstream_client(self) -> aiohttp.ClientSession:
        """The upstream client, opened at the first request (in the loop that serves the app)."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout,
                                              sock_read=self.config.read_timeout),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        return self._client

    async def aclose(self) -> None:
        """Attest every exchange that is over (the server has stopped, its
        cancelled handlers have queued theirs), then close the upstream
        client."""
        await self._attesting.aclose()
        if self._client is not None:
            await self._client.close()

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # served with lifespan="off": nothing else arrives
            return
        headers = [(key.decode("latin-1").lower(), value.decode("latin-1")) for key, value in scope["headers"]]
        named = dict(headers)
        try:
            client, forwarded = self.config.credentials.authenticate(headers, self.config.upstream_key)
            wire = classify_path(scope["method"], scope["raw_path"])
            session_id = session_id_of(_raw_header(scope, SESSION_HEADER)) if wire != "catalog" else ""
            if session_id and not self._rates.allow(session_id):
                raise Refusal(429, f"session {session_id!r} sends over {self.config.session_rate:g} requests a "
                                   f"second")
            exchange = Exchange(wire, session_id, next(self._arrivals), client) if session_id and wire != "catalog" \
                else None
            body = await self._body(receive, named.get("content-length"), client, exchange)
        except Refusal as refusal:
            REFUSED.labels(str(refusal.status)).inc()
            await _error(send, refusal.status, refusal.message)
            return
        if body is None:  # the client went away while sending it
            return
        try:
            await self._exchange(scope, wire, forwarded, body, receive, send, exchange,
                                 named.get(COMPACT_HEADER) == "1")
        finally:
            if exchange is None:
                self._memory.give(client, len(body))

    async def _exchange(self, scope: dict[str, Any], wire: str, headers: list[tuple[str, str]], body: bytes,
                        receive: Callable, send: Callable, exchange: Exchange | None, compact_header: bool) -> None:
        if exchange is not None and self.rewrite is not None:
            body = self._rewritten(exchange, body)
        elif exchange is None and wire != "catalog":
            REQUESTS.labels(wire, "no-session", "forwarded").inc()
            log.warning("a %s request to %s names no session (%s): forwarded, not attested", wire, scope["path"],
                        SESSION_HEADER)
        try:
            await self._forward(scope, headers, body, receive, send, exchange)
        except asyncio.CancelledError:  # the server is stopping and its grace ran out
            _outcome(exchange, "gateway-stopped", None)
            raise
        finally:
            if exchange is not None:  # read once the exchange is over: none of it delays a response
                await self._attesting.finished(exchange, body, compact_header)

    async def _body(self, receive: Callable, declared: str | None, client: str,
                    exchange: Exchange | None) -> bytes | None:
        """The request body, within the size, memory and time limits
        (:class:`Refusal` beyond), digested as it arrives; ``None`` if the
        client went away. A body of ``declared`` length has its memory
        counted whole before it is read (so that many large bodies arriving
        at once do not each get part of the memory and all fail); its bytes
        stay counted, as ``client``'s, until given back."""
        limit = self.config.max_body_bytes
        reserved = int(declared) if declared is not None and declared.isdigit() else 0
        if reserved > limit:
            raise Refusal(413, f"request body of {reserved} bytes, over {limit}")
        if not self._memory.take(client, reserved):
            raise self._crowded()
        chunks, size, digest = [], 0, hashlib.sha256()
        try:
            async with asyncio.timeout(self.config.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        self._memory.give(client, reserved)
                        return None
                    chunk = message.get("body", b"")
                    if size + len(chunk) > limit:
                        raise Refusal(413, f"request body over {limit} bytes")
                    if size + len(chunk) > reserved:  # a body of no declared length: counted as it comes
                        if not self._memory.take(client, size + len(chunk) - reserved):
                            raise self._crowded()
                        reserved = size + len(chunk)
                    size += len(chunk)
                    digest.update(chunk)
                    chunks.append(chunk)
                    if not message.get("more_body"):
                        break
        except TimeoutError:
            self._memory.give(client, reserved)
            raise Refusal(408, f"the request body did not arrive within {self.config.body_timeout:g} s") from None
        except Refusal:
            self._memory.give(client, reserved)
            raise
        self._memory.give(client, reserved - size)
        if exchange is not None:
            exchange.body_bytes, exchange.raw_digest = size, digest.hexdigest()
        return b"".join(chunks)

    def _crowded(self) -> Refusal:
        return Refusal(503, f"the gateway holds {self._memory.held} bytes of request bodies, near its limit of "
                            f"{self._memory.limit} or past this client's share of it: try again")

    def _rewritten(self, exchange: Exchange, body: bytes) -> bytes:
        """The body as the rewrite hook makes it (a body that is no JSON
        object is forwarded as it came)."""
        assert self.rewrite is not None
        try:
            parsed = json.loads(body)
        except ValueError:
            return body
        return json.dumps(self.rewrite(exchange.wire, parsed)).encode() if isinstance(parsed, dict) else body

    async def _forward(self, scope: dict[str, Any], headers: list[tuple[str, str]], body: bytes, receive: Callable,
                       send: Callable, exchange: Exchange | None) -> None:
        forwarded = [(k, v) for k, v in headers if k not in _NOT_FORWARDED]
        if "accept-encoding" not in dict(headers):  # no upstream may pick an encoding the client did not ask for
            forwarded.append(("accept-encoding", "identity"))
        query = scope["query_string"].decode("latin-1")
        # the path as the client spelled it, checked to be normal: the upstream sees the same segments
        url = self.upstream + scope["raw_path"].decode("ascii") + ("?" + query if query else "")
        started = time.perf_counter()
        try:
            # a large body is written a chunk at a time, the loop free between two (aiohttp's own advice)
            data = io.BytesIO(body) if len(body) > _WRITTEN_AT_ONCE else body
            response = await self._upstream_client().request(scope["method"], url, headers=forwarded, data=data,
                                                             allow_redirects=False)
        except TimeoutError as error:
            _outcome(exchange, "upstream-stalled", error)
            await _error(send, 504, f"the model endpoint did not answer in time ({type(error).__name__})")
            return
        except aiohttp.ClientError as error:
            _outcome(exchange, "upstream-unreachable", error)
            await _error(send, 502, f"the model endpoint is unreachable ({type(error).__name__})")
            return
        FIRST_BYTE.observe(time.perf_counter() - started)
        if exchange is not None:
            exchange.first_byte_ms = (time.perf_counter() - started) * 1000
            exchange.status = response.status
            if response.status in _REFUSED_BY_UPSTREAM:  # the model saw nothing: the auditor ignores it
                exchange.outcome = "refused"
        STREAMS.inc()
        try:
            await self._stream(response, receive, send, exchange)
        finally:
            STREAMS.dec()
            response.release()  # back to the pool when read to its end, else closed
            if exchange is not None:
                exchange.upstream_ms = (time.perf_counter() - started) * 1000

    async def _stream(self, response: aiohttp.ClientResponse, receive: Callable, send: Callable,
                      exchange: Exchange | None) -> None:
        """Relay the response in this task (no hand-over before the first
        byte); a watcher cancels it when the client goes away, a
        :class:`_Silence` when the upstream stalls."""
        relaying = asyncio.current_task()
        assert relaying is not None
        client_gone = False

        async def watch() -> None:
            nonlocal client_gone
            while (await receive())["type"] != "http.disconnect":
                pass
            client_gone = True
            relaying.cancel()

        watcher = asyncio.create_task(watch())
        protocol = response.connection.protocol if response.connection is not None else None
        if protocol is not None:  # the head is in: the body's silences are timed by one timer, not one per chunk
            protocol.read_timeout = None
            protocol.start_timeout()  # (with none, this drops the timer armed at the head's read)
        silence = _Silence(relaying, self.config.read_timeout)
        try:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(k, v) for k, v in response.raw_headers
                                    if k.decode("latin-1").lower() not in _RESPONSE_NOT_FORWARDED]})
            read, now = response.content.readany, silence.loop.time
            while chunk := await read():  # (b"" at the end; iter_any() is the same with a frame more per chunk)
                silence.since = None  # the client is slow, not the upstream, while this waits
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                silence.since = now()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not (client_gone or silence.expired):
                raise
            relaying.uncancel()
            if client_gone:
                _outcome(exchange, "client-disconnected", None)
            else:
                stalled = TimeoutError(f"the model endpoint was silent for {self.config.read_timeout:g} s")
                _outcome(exchange, "upstream-stalled", stalled)
                raise stalled from None  # the server drops the connection, as below
        except Exception as error:
            _outcome(exchange, "upstream-stalled" if isinstance(error, TimeoutError) else "upstream-reset", error)
            raise  # the server drops the connection: the client sees the stream break off, as it did
        finally:
            watcher.cancel()  # a response complete reads as a disconnect: the watcher must not see it
            silence.cancel()


class _Silence:
    """Cancels ``task`` once the upstream it waits on has been silent for
    ``seconds`` (:attr:`expired` says so). One timer per stream, moved on
    only when it fires: aiohttp's own read timeout cancels and makes a timer
    at every chunk it reads (about 3% of the gateway's CPU at 50 streams)."""

    def __init__(self, task: asyncio.Task, seconds: float) -> None:
        self.task, self.seconds = task, seconds
        self.loop = asyncio.get_running_loop()
        self.since: float | None = self.loop.time()  # waiting on the upstream since (None: not waiting on it)
        self.expired = False
        self._timer = self.loop.call_later(seconds, self._check)

    def _check(self) -> None:
        waited = 0.0 if self.since is None else self.loop.time() - self.since
        if waited < self.seconds:
            self._timer = self.loop.call_later(self.seconds - waited, self._check)
        elif not self.task.cancelling():  # (a task being stopped already is left to that)
            self.expired = True
            self.task.cancel()

    def cancel(self) -> None:
        self._timer.cancel()


def _raw_header(scope: dict[str, Any], name: str) -> bytes:
    """The bytes of a request header as they came (the last, if repeated)."""
    return next((value for key, value in reversed(scope["headers"]) if key.lower() == name.encode()), b"")


def _outcome(exchange: Exchange | None, outcome: str, error: BaseException | None) -> None:
    if exchange is not None:
        exchange.outcome = outcome
    where = f"session {exchange.session_id!r} arrival {exchange.arrival}" if exchange else "an unattested request"
    log.warning("%s: %s%s", where, outcome, f" ({type(error).__name__}: {error})" if error else "")


async def _error(send: Callable, status: int, message: str) -> None:
    """An error answered by the gateway itself, in the Messages error shape;
    the connection is closed after it (what is left of the request, if
    anything, is not read)."""
    payload = json.dumps({"type": "error", "error": {"type": "api_error", "message": f"gateway: {message}"}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})
