"""Attesting the gateway's finished exchanges without delaying anyone's bytes.

Reading a request (parse, normalize, classify, digest) costs time that
grows with its size, so it never runs on the event loop: each finished
exchange's body goes to a process pool (a thread would hold the GIL), and
the attestations are published in the order the exchanges finished (the
auditor matches a session's requests in order). A body over the parse limit
is not read at all: its attestation carries the SHA-256 of its bytes, taken
as they passed (:data:`~dsh_core.wire_request.RAW_ALGORITHM`).

The bodies waiting here are counted in the gateway's body memory
(:class:`~producers.gateway_admission.BodyMemory`) until read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Awaitable, Callable

from prometheus_client import Counter

from dsh_core.jsonvalue import encode_json
from dsh_core.wire_request import ALGORITHM, RAW_ALGORITHM, Wire, classify, normalize, request_parts, wire_digest
from dsh_kafka.records import SessionRecord, wire_attestation_record

__all__ = ["Attesting", "Exchange", "read_request"]

log = logging.getLogger("dsh_pipeline.gateway")

#: Parts are dropped from an attestation whose parts are larger than this (the digest stays).
_PARTS_LIMIT = 48 * 1024
#: Exchanges over, waiting to be attested: a handler whose exchange finds
#: the queue full waits (its response is complete already).
_QUEUE = 1024
_NICER = 10

REQUESTS = Counter("dsh_gateway_requests_total", "Requests through the gateway, by wire, kind and outcome.",
                   ["wire", "kind", "outcome"])
ATTESTED = Counter("dsh_gateway_attestations_total", "Wire attestations handed to the publisher, by result.",
                   ["result"])

Attest = Callable[[SessionRecord], Awaitable[None]]


class Exchange:
    """What one request's attestation says."""

    def __init__(self, wire: Wire, session_id: str, arrival: int, client: str) -> None:
        self.wire, self.session_id, self.arrival, self.client = wire, session_id, arrival, client
        self.status: int | None = None
        self.outcome = "completed"
        self.received = time.time()
        self.body_bytes = 0
        self.raw_digest = ""  # hex SHA-256 of the body as it passed

    def value(self, instance: str, read: dict[str, Any]) -> dict[str, Any]:
        return {"gateway": instance, "client": self.client, "arrival": self.arrival, "wire": self.wire,
                "status": self.status, "outcome": self.outcome, "receivedAt": round(self.received * 1000), **read}


def read_request(wire: Wire, body: bytes, compact_header: bool) -> dict[str, Any]:
    """The attestation's reading of a request body: ``kind``, ``algorithm``,
    ``digest`` and ``parts`` (``problem`` instead of a digest when the body
    is no request of ``wire``). Runs in a pool worker."""
    unread = {"kind": "agent", "algorithm": ALGORITHM, "digest": None, "parts": None}
    try:
        parsed = json.loads(body)
        if not isinstance(parsed, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as error:
        return unread | {"problem": f"the request body is not a JSON object: {error}"}
    try:
        normalized = normalize(wire, parsed)
    except (AttributeError, KeyError, TypeError, ValueError, RecursionError) as error:  # the upstream judged it
        return unread | {"problem": f"the request body is not a {wire} request ({type(error).__name__}: {error})"}
    parts = request_parts(normalized)
    return {"kind": classify(normalized, compact_header), "algorithm": ALGORITHM, "digest": wire_digest(normalized),
            "parts": parts if len(encode_json(parts)) <= _PARTS_LIMIT else None}


def _raw_reading(exchange: Exchange, compact_header: bool) -> dict[str, Any]:
    """The reading of a body over the parse limit: its bytes' digest."""
    return {"kind": "compaction" if compact_header else "agent", "algorithm": RAW_ALGORITHM,
            "digest": exchange.raw_digest, "parts": None, "bytes": exchange.body_bytes}


def _pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes at a lower CPU priority than the gateway's own: on a
    busy host, relaying comes first."""
    context = multiprocessing.get_context("forkserver")  # not fork: the gateway runs threads (the Kafka client's)
    context.set_forkserver_preload([__name__])
    return ProcessPoolExecutor(workers, mp_context=context, initializer=os.nice, initargs=(_NICER,))


class Attesting:
    """Reads finished exchanges in a pool of ``workers`` processes and hands
    their attestations to ``attest`` in the order they finished. ``release``
    is called with a body's size once it is read (or not to be read)."""

    def __init__(self, instance: str, attest: Attest, workers: int, parse_limit: int,
                 release: Callable[[int], None]) -> None:
        self.instance, self.attest, self.workers, self.parse_limit = instance, attest, workers, parse_limit
        self.release = release
        self._pool = _pool(workers)
        self._pool.submit(int).result()  # the workers are up before the first exchange needs one
        self._finished: asyncio.Queue[tuple[Exchange, asyncio.Future]] | None = None
        self._publishing: asyncio.Task | None = None

    async def finished(self, exchange: Exchange, body: bytes, compact_header: bool) -> None:
        """Queue an exchange that is over; its body is read at once in the pool."""
        loop = asyncio.get_running_loop()
        if exchange.body_bytes > self.parse_limit:
            self.release(exchange.body_bytes)
            reading: asyncio.Future = loop.create_future()
            reading.set_result(_raw_reading(exchange, compact_header))
        else:
            reading = self._read(loop, exchange, body, compact_header)
        if self._finished is None:
            self._finished = asyncio.Queue(_QUEUE)
            self._publishing = asyncio.create_task(self._publish_in_order())
        await self._finished.put((exchange, reading))

    def _read(self, loop: asyncio.AbstractEventLoop, exchange: Exchange, body: bytes, compact_header: bool
              ) -> asyncio.Future:
        try:
            reading = loop.run_in_executor(self._pool, read_request, exchange.wire, body, compact_header)
        except BrokenProcessPool:  # a worker died (killed, out of memory): a new pool for this and later ones
            log.error("the gateway's attesting workers died; starting new ones")
            self._pool.shutdown(wait=False)
            self._pool = _pool(self.workers)
            reading = loop.run_in_executor(self._pool, read_request, exchange.wire, body, compact_header)
        reading.add_done_callback(lambda _: self.release(exchange.body_bytes))
        return reading

    async def _publish_in_order(self) -> None:
        assert self._finished is not None
        while True:
            exchange, reading = await self._finished.get()
            try:
                read = await reading
                REQUESTS.labels(exchange.wire, read["kind"], exchange.outcome).inc()
                await self._publish(exchange, exchange.value(self.instance, read))
            except Exception:  # noqa: BLE001 - a fault of ours in one exchange must not stop the others' attestations
                ATTESTED.labels("failed").inc()
                log.exception("session %r arrival %d (%s) was not attested", exchange.session_id, exchange.arrival,
                              exchange.wire)
            finally:
                self._finished.task_done()

    async def _publish(self, exchange: Exchange, value: dict[str, Any]) -> None:
        try:
            await self.attest(wire_attestation_record(exchange.session_id, exchange.arrival, encode_json(value)))
            ATTESTED.labels("sent").inc()
        except Exception as error:  # noqa: BLE001 - the agent's exchange is over; say what was lost, go on
            ATTESTED.labels("failed").inc()
            log.error("the attestation of session %r arrival %d (%s) was not published: %s", exchange.session_id,
                      exchange.arrival, exchange.wire, error)

    async def aclose(self) -> None:
        """Attest every exchange that is over, then stop the workers."""
        if self._finished is not None and self._publishing is not None:
            await self._finished.join()
            self._publishing.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
