"""Limits a listener keeps whatever its clients do: a deadline for each
request to arrive, a bound on the request head, a bound on open
connections that sheds idle ones first.

uvicorn times out only idle keep-alive connections: a connection that
never sends a byte, or sends a header a line a second, is kept forever,
and its ``limit_concurrency`` counts idle connections too, answering 503
to everyone (``/healthz`` included) once enough of them are open.
:func:`limited_protocol` makes a subclass of uvicorn's httptools protocol
(the HTTP parsing stays uvicorn's and llhttp's) that adds:

* **a request deadline**: from the moment a connection is ready for a
  request (accepted, or its last response sent) its head must arrive within
  :attr:`ListenerLimits.head_seconds` and the whole request, head and body,
  within :attr:`ListenerLimits.request_seconds`, or the connection is
  closed; a slow head, a slow body and a silent client are all cut off
  (an idle keep-alive connection waits :attr:`ListenerLimits.idle_seconds`
  for its next request to begin, uvicorn's ``timeout_keep_alive`` too; the
  head deadline runs from that request's first byte);
* **a head bound**: a request head over :attr:`ListenerLimits.max_head_bytes`
  is answered 431 and the connection closed (llhttp has no limit of its own;
  the bound is checked after each read, so at most one read more is parsed);
* **a connection bound**: at most :attr:`ListenerLimits.max_connections`
  (and at most a quarter of the process's open-file limit: a process has a
  service port and an operations port, and needs the other half for its
  own files and clients) are open; a new connection beyond it closes the
  least recently active one that has no request in progress, so idle and
  half-sent connections cannot keep a real request (a health probe) out.
  Only when every connection is busy is the new one answered 503 and closed
  instead.

Memory per server is bounded by the connection bound.
"""

from __future__ import annotations

import asyncio
import collections
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ListenerLimits", "limited_protocol"]

_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
              b"content-length: 28\r\nconnection: close\r\n\r\nthe request head is too large")
_ALL_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n"
             b"content-length: 33\r\nconnection: close\r\n\r\nevery connection is busy: retry")


@dataclass(frozen=True)
class ListenerLimits:
    request_seconds: float = 10.0  # for a whole request to arrive, once the connection is ready for one
    head_seconds: float | None = None  # for its head to arrive (None: request_seconds)
    idle_seconds: int = 5  # an idle keep-alive connection is closed after this (uvicorn takes whole seconds)
    max_connections: int = 256
    max_head_bytes: int = 64 * 1024

    def connection_bound(self) -> int:
        """:attr:`max_connections`, within a quarter of the open-file limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return self.max_connections if soft == resource.RLIM_INFINITY else min(self.max_connections, soft // 4)


def limited_protocol(limits: ListenerLimits) -> type[HttpToolsProtocol]:
    """A protocol class for one server (``uvicorn.Config(http=...)``): its
    connections are counted together."""
    bound = limits.connection_bound()
    head_seconds = limits.request_seconds if limits.head_seconds is None else limits.head_seconds
    # every open connection, least recently active first
    open_connections: collections.OrderedDict[LimitedProtocol, None] = collections.OrderedDict()

    class LimitedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _ready_at = 0.0  # loop time the connection became ready for the request being read
        _head_bytes = 0  # of the request head being read
        _reading_head = True  # the next bytes are a request head's
        _mid_request = False  # a request began and is not all read
        _idle = False  # every request answered: waiting (idle_seconds) for the next to begin
        _extend = False  # its head is read: the rest of it gets what is left of its deadline, unless read at once
        _requests = _responses = 0  # requests whose head was read; responses sent

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            open_connections[self] = None
            if len(open_connections) > bound:
                idle = next((c for c in open_connections if c is not self and c._requests == c._responses), self)
                open_connections.pop(idle)
                if idle is self:
                    transport.write(_ALL_BUSY)
                idle.transport.close()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            open_connections.pop(self, None)
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self in open_connections:
                open_connections.move_to_end(self)
            reading_head = self._reading_head
            super().data_received(data)
            if self._extend:  # (a request read whole in one read, as most are, needs no deadline of its own)
                self._extend = False
                self._arm(self._ready_at + limits.request_seconds - self.loop.time())
            if reading_head and self._reading_head:  # no complete head yet: what came counts against the bound
                self._head_bytes += len(data)  # (a body sent in the same read as its head does not)
                if self._head_bytes > limits.max_head_bytes:
                    self.transport.write(_TOO_LARGE)
                    self.transport.close()

        def on_message_begin(self) -> None:
            self._mid_request = True
            if self._idle:  # a kept-alive connection's next request began: its head deadline runs from now
                self._idle = False
                self._arm()
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._requests += 1
            self._reading_head = False
            self._extend = head_seconds < limits.request_seconds
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._mid_request, self._reading_head, self._head_bytes, self._extend = False, True, 0, False
            self._disarm()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._responses += 1
            if self._mid_request:  # the rest of a request already begun
                self._arm()
            elif self._requests == self._responses:  # idle, kept alive until its next request begins
                self._idle = True
                self._arm(max(limits.idle_seconds, head_seconds))
            super().on_response_complete()

        def _arm(self, seconds: float | None = None) -> None:
            """Close the connection unless disarmed within ``seconds`` (by
            default: a new request's head deadline, from now)."""
            self._disarm()
            if seconds is None:
                self._ready_at, seconds = self.loop.time(), min(head_seconds, limits.request_seconds)
            self._deadline = self.loop.call_later(seconds, self.transport.close)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

    return LimitedProtocol
