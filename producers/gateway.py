"""The attesting model gateway: a reverse proxy for the model APIs dsh speaks.

dsh agents reach it by pointing ``DEEPSEEK_BASE_URL`` at it. Each request
is forwarded to the upstream unchanged (a ``rewrite`` hook aside, whose
changes are attested like any other content) and the response is streamed
back unchanged, byte for byte and chunk by chunk. Authentication headers
pass through and are never logged, stored or published.

For every request on a model API path (``…/chat/completions``, ``…/messages``)
that names its session (``x-deepseek-harness-session-id``) it publishes a
wire attestation on the session's key once the exchange is over
(:func:`dsh_kafka.records.wire_attestation_record`): which gateway and
arrival, the wire, its classification (an agent step, a session title, a
compaction summary), the upstream status and how the exchange ended, and
the digest and parts of the request's ``dsh-request/1`` form
(:mod:`dsh_core.wire_request`). The auditor matches it to the request
boundary of the log.

The ASGI app is served by uvicorn (:class:`~producers.asgi_server.AsgiServer`);
aiohttp is the upstream client.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp
from prometheus_client import Counter, Gauge, Histogram

from dsh_core.jsonvalue import encode_json
from dsh_core.wire_request import ALGORITHM, Wire, classify, normalize, request_parts, wire_digest
from dsh_kafka.records import SessionRecord, wire_attestation_record

__all__ = ["Gateway", "GatewayConfig", "SESSION_HEADER", "wire_of"]

log = logging.getLogger("dsh_pipeline.gateway")

SESSION_HEADER = "x-deepseek-harness-session-id"
COMPACT_HEADER = "x-deepseek-harness-compact"
#: Hop-by-hop headers (RFC 9110 §7.6.1) and those the client library sets itself.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                            "transfer-encoding", "upgrade", "host", "content-length"})
_RESPONSE_NOT_FORWARDED = _NOT_FORWARDED - {"content-length"}
#: Parts are dropped from an attestation larger than this (the digest stays).
_PARTS_LIMIT = 48 * 1024
#: Exchanges over, waiting to be attested: a handler whose exchange finds
#: the queue full waits (its response is complete already).
_ATTESTING_QUEUE = 1024

REQUESTS = Counter("dsh_gateway_requests_total", "Requests through the gateway, by wire, kind and outcome.",
                   ["wire", "kind", "outcome"])
FIRST_BYTE = Histogram("dsh_gateway_upstream_first_byte_seconds", "Upstream time to response headers.",
                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
STREAMS = Gauge("dsh_gateway_streams", "Responses being streamed now.")
ATTESTED = Counter("dsh_gateway_attestations_total", "Wire attestations handed to the publisher, by result.",
                   ["result"])

Attest = Callable[[SessionRecord], Awaitable[None]]
Rewrite = Callable[[Wire, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    upstream: str  # the fleet's model endpoint, as its DEEPSEEK_BASE_URL would be
    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # the longest silence of an upstream stream before it counts as stalled
    max_body_bytes: int = 64 * 1024 * 1024
    instance: str = ""  # names this gateway in its attestations (default host:pid)


def wire_of(path: str) -> Wire | None:
    """The model API a request path belongs to, if any."""
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat-completions"
    if path.endswith("/messages"):
        return "messages"
    return None


class _Exchange:
    """What one request's attestation says."""

    def __init__(self, wire: Wire, session_id: str, arrival: int) -> None:
        self.wire, self.session_id, self.arrival = wire, session_id, arrival
        self.kind = "agent"
        self.status: int | None = None
        self.outcome = "completed"
        self.normalized: dict[str, Any] | None = None
        self.problem: str | None = None
        self.received = time.time()

    def value(self, instance: str) -> dict[str, Any]:
        body: dict[str, Any] = {"gateway": instance, "arrival": self.arrival, "wire": self.wire, "kind": self.kind,
                                "status": self.status, "outcome": self.outcome,
                                "receivedAt": round(self.received * 1000), "algorithm": ALGORITHM,
                                "digest": None, "parts": None}
        if self.normalized is not None:
            body["digest"] = wire_digest(self.normalized)
            body["parts"] = request_parts(self.normalized)
        if self.problem is not None:
            body["problem"] = self.problem
        return body


class Gateway:
    """The ASGI app. ``attest`` publishes a finished exchange's record."""

    def __init__(self, config: GatewayConfig, attest: Attest, rewrite: Rewrite | None = None) -> None:
        self.config = config
        self.attest = attest
        self.rewrite = rewrite
        self.instance = config.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.upstream = config.upstream.rstrip("/")
        self._arrivals: dict[str, itertools.count] = {}
        self._client: aiohttp.ClientSession | None = None
        self._finished: asyncio.Queue[tuple[_Exchange, bytes, bool]] | None = None
        self._attesting: asyncio.Task | None = None

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
        if self._finished is not None and self._attesting is not None:
            await self._finished.join()
            self._attesting.cancel()
        if self._client is not None:
            await self._client.close()

    async def _attest_finished(self) -> None:
        """Read and attest finished exchanges one at a time, letting the
        loop forward and relay between two: when many streams end together
        (and their clients' next requests arrive), those requests' first
        bytes do not wait for every attestation of the round."""
        assert self._finished is not None
        while True:
            exchange, body, compact_header = await self._finished.get()
            try:
                self._read(exchange, body, compact_header)
                REQUESTS.labels(exchange.wire, exchange.kind, exchange.outcome).inc()
                await self._publish(exchange)
            except Exception:  # noqa: BLE001 - a fault of ours in one exchange must not stop the others' attestations
                ATTESTED.labels("failed").inc()
                log.exception("session %r arrival %d (%s) was not attested", exchange.session_id, exchange.arrival,
                              exchange.wire)
            finally:
                self._finished.task_done()
            await asyncio.sleep(0)

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":  # served with lifespan="off": nothing else arrives
            return
        body = await self._body(receive)
        if body is None:
            await _error(send, 413, f"request body over {self.config.max_body_bytes} bytes")
            return
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        named = dict(headers)
        wire = wire_of(scope["path"]) if scope["method"] == "POST" else None
        session_id = named.get(SESSION_HEADER, "")
        exchange = None
        if wire is not None and session_id:
            arrival = next(self._arrivals.setdefault(session_id, itertools.count(1)))
            exchange = _Exchange(wire, session_id, arrival)
            if self.rewrite is not None:
                body = self._rewritten(exchange, body)
        elif wire is not None:
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
                await self._attesting_queue().put((exchange, body, named.get(COMPACT_HEADER) == "1"))

    def _attesting_queue(self) -> asyncio.Queue[tuple[_Exchange, bytes, bool]]:
        """The queue of finished exchanges, and its worker, made at the first (in the loop that serves the app)."""
        if self._finished is None:
            self._finished = asyncio.Queue(_ATTESTING_QUEUE)
            self._attesting = asyncio.create_task(self._attest_finished())
        return self._finished

    async def _body(self, receive: Callable) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.config.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        return b"".join(chunks)

    def _rewritten(self, exchange: _Exchange, body: bytes) -> bytes:
        """The body as the rewrite hook makes it (a body that is no JSON
        object is forwarded as it came)."""
        try:
            parsed = json.loads(body)
        except ValueError:
            return body
        return json.dumps(self.rewrite(exchange.wire, parsed)).encode() if isinstance(parsed, dict) else body

    def _read(self, exchange: _Exchange, body: bytes, compact_header: bool) -> None:
        """Normalize and classify the forwarded request."""
        try:
            parsed = json.loads(body)
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            exchange.problem = f"the request body is not a JSON object: {error}"
            return
        try:
            exchange.normalized = normalize(exchange.wire, parsed)
        except (AttributeError, KeyError, TypeError, ValueError) as error:  # forwarded all the same: the upstream judges
            exchange.problem = f"the request body is not a {exchange.wire} request ({type(error).__name__}: {error})"
            return
        exchange.kind = classify(exchange.normalized, compact_header)

    async def _forward(self, scope: dict[str, Any], headers: list[tuple[str, str]], body: bytes, receive: Callable,
                       send: Callable, exchange: _Exchange | None) -> None:
        forwarded = [(k, v) for k, v in headers if k not in _NOT_FORWARDED]
        if "accept-encoding" not in dict(forwarded):  # no upstream may pick an encoding the client did not ask for
            forwarded.append(("accept-encoding", "identity"))
        url = self.upstream + scope["path"] + (("?" + scope["query_string"].decode()) if scope["query_string"] else "")
        started = time.perf_counter()
        try:
            response = await self._upstream_client().request(scope["method"], url, headers=forwarded, data=body,
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
            exchange.status = response.status
        STREAMS.inc()
        try:
            await self._stream(response, receive, send, exchange)
        finally:
            STREAMS.dec()
            response.release()  # back to the pool when read to its end, else closed

    async def _stream(self, response: aiohttp.ClientResponse, receive: Callable, send: Callable,
                      exchange: _Exchange | None) -> None:
        """Relay the response in this task (no hand-over before the first
        byte); a watcher cancels it when the client goes away."""
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
        try:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(k, v) for k, v in response.raw_headers
                                    if k.decode("latin-1").lower() not in _RESPONSE_NOT_FORWARDED]})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not client_gone:
                raise
            relaying.uncancel()
            _outcome(exchange, "client-disconnected", None)
        except Exception as error:
            _outcome(exchange, "upstream-stalled" if isinstance(error, TimeoutError) else "upstream-reset", error)
            raise  # the server drops the connection: the client sees the stream break off, as it did
        finally:
            watcher.cancel()  # a response complete reads as a disconnect: the watcher must not see it

    async def _publish(self, exchange: _Exchange) -> None:
        value = exchange.value(self.instance)
        encoded = encode_json(value)
        if len(encoded) > _PARTS_LIMIT:
            value["parts"] = None
            encoded = encode_json(value)
        try:
            await self.attest(wire_attestation_record(exchange.session_id, exchange.arrival, encoded))
            ATTESTED.labels("sent").inc()
        except Exception as error:  # noqa: BLE001 - the agent's exchange is over; say what was lost, go on
            ATTESTED.labels("failed").inc()
            log.error("the attestation of session %r arrival %d (%s) was not published: %s", exchange.session_id,
                      exchange.arrival, exchange.wire, error)


def _outcome(exchange: _Exchange | None, outcome: str, error: BaseException | None) -> None:
    if exchange is not None:
        exchange.outcome = outcome
    where = f"session {exchange.session_id!r} arrival {exchange.arrival}" if exchange else "an unattested request"
    log.warning("%s: %s%s", where, outcome, f" ({type(error).__name__}: {error})" if error else "")


async def _error(send: Callable, status: int, message: str) -> None:
    """An error answered by the gateway itself, in the Messages error shape."""
    payload = json.dumps({"type": "error", "error": {"type": "api_error", "message": f"gateway: {message}"}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
