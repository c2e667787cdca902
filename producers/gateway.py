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

The ASGI app is served by uvicorn; httpx is the upstream client.
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

import httpx
import uvicorn
from prometheus_client import Counter, Gauge, Histogram

from dsh_core.errors import PipelineError
from dsh_core.jsonvalue import encode_json
from dsh_core.wire_request import ALGORITHM, Wire, classify, normalize, request_parts, wire_digest
from dsh_kafka.records import SessionRecord, wire_attestation_record

__all__ = ["Gateway", "GatewayConfig", "GatewayServer", "SESSION_HEADER", "wire_of"]

log = logging.getLogger("dsh_pipeline.gateway")

SESSION_HEADER = "x-deepseek-harness-session-id"
COMPACT_HEADER = "x-deepseek-harness-compact"
#: Hop-by-hop headers (RFC 9110 §7.6.1) and those the client library sets itself.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                            "transfer-encoding", "upgrade", "host", "content-length"})
#: Parts are dropped from an attestation larger than this (the digest stays).
_PARTS_LIMIT = 48 * 1024

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

    def __init__(self, config: GatewayConfig, attest: Attest, rewrite: Rewrite | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.attest = attest
        self.rewrite = rewrite
        self.instance = config.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.upstream = config.upstream.rstrip("/")
        self._arrivals: dict[str, itertools.count] = {}
        self.client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(config.read_timeout, connect=config.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))

    async def aclose(self) -> None:
        await self.client.aclose()

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
            body = self._read(exchange, body, named.get(COMPACT_HEADER) == "1")
        elif wire is not None:
            REQUESTS.labels(wire, "no-session", "forwarded").inc()
            log.warning("a %s request to %s names no session (%s): forwarded, not attested", wire, scope["path"],
                        SESSION_HEADER)
        try:
            await self._forward(scope, headers, body, receive, send, exchange)
        finally:
            if exchange is not None:
                REQUESTS.labels(exchange.wire, exchange.kind, exchange.outcome).inc()
                await self._publish(exchange)

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

    def _read(self, exchange: _Exchange, body: bytes, compact_header: bool) -> bytes:
        """Normalize and classify the request; apply the rewrite hook."""
        try:
            parsed = json.loads(body)
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
        except ValueError as error:
            exchange.problem = f"the request body is not a JSON object: {error}"
            return body
        if self.rewrite is not None:
            parsed = self.rewrite(exchange.wire, parsed)
            body = json.dumps(parsed).encode()
        try:
            exchange.normalized = normalize(exchange.wire, parsed)
        except (AttributeError, KeyError, TypeError, ValueError) as error:  # forwarded all the same: the upstream judges
            exchange.problem = f"the request body is not a {exchange.wire} request ({type(error).__name__}: {error})"
            return body
        exchange.kind = classify(exchange.normalized, compact_header)
        return body

    async def _forward(self, scope: dict[str, Any], headers: list[tuple[str, str]], body: bytes, receive: Callable,
                       send: Callable, exchange: _Exchange | None) -> None:
        forwarded = [(k, v) for k, v in headers if k not in _NOT_FORWARDED]
        if "accept-encoding" not in dict(forwarded):  # else httpx asks for gzip, and the client gets bytes it cannot read
            forwarded.append(("accept-encoding", "identity"))
        url = self.upstream + scope["path"] + (("?" + scope["query_string"].decode()) if scope["query_string"] else "")
        started = time.perf_counter()
        try:
            response = await self.client.send(self.client.build_request(scope["method"], url, headers=forwarded,
                                                                       content=body), stream=True)
        except httpx.TimeoutException as error:
            _outcome(exchange, "upstream-stalled", error)
            await _error(send, 504, f"the model endpoint did not answer in time ({type(error).__name__})")
            return
        except httpx.HTTPError as error:
            _outcome(exchange, "upstream-unreachable", error)
            await _error(send, 502, f"the model endpoint is unreachable ({type(error).__name__})")
            return
        FIRST_BYTE.observe(time.perf_counter() - started)
        if exchange is not None:
            exchange.status = response.status_code
        STREAMS.inc()
        try:
            await self._stream(response, receive, send, exchange)
        finally:
            STREAMS.dec()
            await response.aclose()

    async def _stream(self, response: httpx.Response, receive: Callable, send: Callable,
                      exchange: _Exchange | None) -> None:
        """Relay the response; stop when the client goes away."""
        async def relay() -> None:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw
                                    if k.decode("latin-1").lower() not in _NOT_FORWARDED - {"content-length"}]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        relaying, watching = asyncio.create_task(relay()), asyncio.create_task(disconnected())
        try:
            await asyncio.wait({relaying, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relaying, watching):
                task.cancel()
            await asyncio.gather(relaying, watching, return_exceptions=True)
        if not relaying.cancelled() and relaying.exception() is None:
            return
        if relaying.cancelled():
            _outcome(exchange, "client-disconnected", None)
            return
        error = relaying.exception()
        _outcome(exchange, "upstream-stalled" if isinstance(error, httpx.TimeoutException) else "upstream-reset",
                 error)
        raise error  # the server drops the connection: the client sees the stream break off, as it did

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


class GatewayServer:
    """Serves a :class:`Gateway` with uvicorn on ``host:port`` (0: a free
    port) while in ``async with``; ``url`` once entered. The socket is bound
    and listening on entry, so clients may connect at once; a port that
    cannot be bound is a :class:`PipelineError` naming it."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway, self.host, self.port = gateway, host, port
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "GatewayServer":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(1024)
        except OSError as error:
            sock.close()
            raise PipelineError(f"the gateway cannot listen on {self.host}:{self.port}: {error.strerror or error}") \
                from error
        port = sock.getsockname()[1]
        self.url = f"http://{'[' + self.host + ']' if family == socket.AF_INET6 else self.host}:{port}"
        config = uvicorn.Config(self.gateway, lifespan="off", log_config=None, access_log=False,
                                timeout_keep_alive=75, timeout_graceful_shutdown=5, backlog=1024)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        try:
            await self._task
        finally:
            await self.gateway.aclose()
