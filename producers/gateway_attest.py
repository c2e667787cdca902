"""Attesting the gateway's finished exchanges without delaying anyone's bytes.

Reading a request (parse, normalize, classify, digest) costs time that
grows with its size, so only a body within a small bound (the inline limit,
2 KiB by default: half a millisecond at most) is read on the event loop, one
at a time with the loop's other work between two; a larger one goes to a
process pool (a thread would hold the GIL). The
bodies waiting for a worker go to it together, one hand-off per batch
rather than per exchange, so under load the pool's cost per exchange
shrinks instead of growing. Each session's attestations are published in
the order its exchanges finished (the auditor matches a session's requests
in order). A body over
the parse limit, or finding the pool's backlog full, is not read at all: its
attestation carries the SHA-256 of its bytes, taken as they passed
(:data:`~dsh_core.wire_request.RAW_ALGORITHM`), and says why it was not
read (``unread``).

The bodies waiting here are counted in the gateway's body memory
(:class:`~producers.gateway_admission.BodyMemory`) until read.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import multiprocessing
import os
import select
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Awaitable, Callable, Sequence

from prometheus_client import Counter

from dsh_core.jsonvalue import dump_json, encode_json
from dsh_core.wire_request import ALGORITHM, RAW_ALGORITHM, Wire, classify, normalize, request_parts, wire_digest
from dsh_kafka.records import SessionRecord, wire_attestation_record

__all__ = ["Attesting", "Exchange", "read_request"]

log = logging.getLogger("dsh_pipeline.gateway")

#: Parts are dropped from an attestation whose parts are larger than this (the digest stays).
_PARTS_LIMIT = 48 * 1024
#: Attestations not handed over yet: a handler whose exchange finds as many
#: waits (its response is complete already).
_PENDING = 4096
_NICER = 10

REQUESTS = Counter("dsh_gateway_requests_total", "Requests through the gateway, by wire, kind and outcome.",
                   ["wire", "kind", "outcome"])
ATTESTED = Counter("dsh_gateway_attestations_total", "Wire attestations handed to the publisher, by result.",
                   ["result"])
_SENT, _FAILED = ATTESTED.labels("sent"), ATTESTED.labels("failed")
#: A child of :data:`REQUESTS` by its labels (a few dozen at most), found once rather than per exchange.
_requests = functools.cache(REQUESTS.labels)
UNREAD = Counter("dsh_gateway_unread_requests_total", "Requests attested by their bytes' digest, unread, by why.",
                 ["why"])

#: Hands an attestation record to the publisher (what it returns, a delivery, is not waited on here).
Attest = Callable[[SessionRecord], Awaitable[object]]


class Exchange:
    """What one request's attestation says."""

    def __init__(self, wire: Wire, session_id: str, arrival: int, client: str) -> None:
        self.wire, self.session_id, self.arrival, self.client = wire, session_id, arrival, client
        self.status: int | None = None
        self.outcome = "completed"
        self.received = time.time()
        self.body_bytes = 0
        self.raw_digest = ""  # hex SHA-256 of the body as it passed
        self.first_byte_ms: float | None = None  # from forwarding the request to the upstream's response headers
        self.upstream_ms: float | None = None  # from forwarding the request to the response's last byte relayed

    def value(self, instance: str, read: dict[str, Any]) -> dict[str, Any]:
        upstream = {"firstByteMs": round(self.first_byte_ms, 1)} if self.first_byte_ms is not None else {}
        if upstream and self.upstream_ms is not None:
            upstream["durationMs"] = round(self.upstream_ms, 1)
        return {"gateway": instance, "client": self.client, "arrival": self.arrival, "wire": self.wire,
                "status": self.status, "outcome": self.outcome, "receivedAt": round(self.received * 1000),
                **({"upstream": upstream} if upstream else {}), **read}


def read_request(wire: Wire, body: bytes, compact_header: bool) -> dict[str, Any]:
    """The attestation's reading of a request body: ``kind``, ``algorithm``,
    ``digest`` and ``parts`` (``problem`` instead of a digest when the body
    is no request of ``wire``). Runs in a pool worker, or at once for a small body."""
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
    # measured in msgspec's bytes, within a few of the attestation's: a bound, not a digest
    return {"kind": classify(normalized, compact_header), "algorithm": ALGORITHM, "digest": wire_digest(normalized),
            "parts": parts if len(dump_json(parts)) <= _PARTS_LIMIT else None}


def _read_batch(read: Callable[[Wire, bytes, bool], dict[str, Any]], batch: Sequence[tuple[Wire, bytes, bool]]
                ) -> list[dict[str, Any] | Exception]:
    """The readings of a batch of request bodies, or what went wrong in
    reading each (in a pool worker: a fault in one spares the others)."""
    readings: list[dict[str, Any] | Exception] = []
    for wire, body, compact_header in batch:
        try:
            readings.append(read(wire, body, compact_header))
        except Exception as error:  # noqa: BLE001 - reported by Attesting._attest for this exchange alone
            readings.append(error)
    return readings


def _raw_reading(exchange: Exchange, compact_header: bool, why: str) -> dict[str, Any]:
    """The reading of a body not read: its bytes' digest."""
    return {"kind": "compaction" if compact_header else "agent", "algorithm": RAW_ALGORITHM,
            "digest": exchange.raw_digest, "parts": None, "bytes": exchange.body_bytes, "unread": why}


def _pool(workers: int) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("forkserver")  # not fork: the gateway runs threads (the Kafka client's)
    context.set_forkserver_preload([__name__])
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(),))


def _worker_start(gateway: int) -> None:
    """A worker runs at a lower CPU priority than the gateway (on a busy host
    relaying comes first, and reading falls behind instead: past the backlog
    limit a request is attested unread), and ends with it (a gateway killed
    outright leaves no worker waiting on its queue)."""
    os.nice(_NICER)
    watched = os.pidfd_open(gateway)
    threading.Thread(target=_end_with, args=(watched,), name="gateway-watch", daemon=True).start()


def _end_with(watched: int) -> None:
    select.select([watched], [], [])  # readable once the process is gone
    os._exit(0)


class Attesting:
    """Reads finished exchanges and hands their attestations to ``attest``,
    each session's in the order its exchanges finished (one session's large
    request holds back no other's). A body of at most ``inline_limit`` bytes
    is read on the loop, one at a time; a larger one by a pool of
    ``workers`` processes, the bodies waiting for a free worker handed to it
    as one batch. At most ``queue_bytes`` of bodies wait for a worker: a body
    past that, or past ``parse_limit``, is attested unread, by its bytes'
    digest. ``release`` is called with a body's client and size once it is read (or not
    to be read)."""

    def __init__(self, instance: str, attest: Attest, *, workers: int, inline_limit: int, parse_limit: int,
                 queue_bytes: int, release: Callable[[str, int], None]) -> None:
        self.instance, self.attest, self.workers = instance, attest, workers
        self.inline_limit, self.parse_limit, self.queue_bytes = inline_limit, parse_limit, queue_bytes
        self.release = release
        self._pool = _pool(workers)
        self._pool.submit(int).result()  # the workers are up before the first exchange needs one
        self._queued = 0  # bytes of bodies waiting for a worker or being read by one
        # small bodies to read on the loop: with the future of the reading, or (True) of the attestation,
        # when the reader hands it over too
        self._small: asyncio.Queue[tuple[Exchange, bytes, bool, asyncio.Future[Any], bool]] = asyncio.Queue()
        self._reader: asyncio.Task | None = None  # reads the small bodies, made at the first
        self._waiting: list[tuple[Exchange, bytes, bool, asyncio.Future]] = []  # for the next free worker
        self._batches = 0  # batches being read by a worker
        self._pending = asyncio.Semaphore(_PENDING)
        # each session's last attestation not yet handed over (a task, or the reader's future of it)
        self._latest: dict[str, asyncio.Future[Any]] = {}
        self._attesting: set[asyncio.Future[Any]] = set()

    async def finished(self, exchange: Exchange, body: bytes, compact_header: bool) -> None:
        """Attest an exchange that is over: its body is read now or handed to
        the pool; its attestation is handed over after its session's earlier ones."""
        await self._pending.acquire()  # many attestations not handed over yet (a slow Kafka): wait for room
        earlier = self._latest.get(exchange.session_id)
        attested: asyncio.Future[Any]
        if earlier is None and exchange.body_bytes <= self.inline_limit:
            # the common case: the small reader reads it and hands it over in turn, no task of its own
            attested = asyncio.get_running_loop().create_future()
            self._read_on_loop(exchange, body, compact_header, attested, True)
        else:
            reading = self._reading(exchange, body, compact_header)
            attested = asyncio.create_task(self._attest_later(exchange, reading, earlier))
        self._latest[exchange.session_id] = attested
        self._attesting.add(attested)
        attested.add_done_callback(lambda _: self._over(exchange.session_id, attested))

    def _over(self, session_id: str, attested: asyncio.Future[Any]) -> None:
        self._attesting.discard(attested)
        if self._latest.get(session_id) is attested:
            del self._latest[session_id]
        self._pending.release()

    def _read_on_loop(self, exchange: Exchange, body: bytes, compact_header: bool, future: asyncio.Future[Any],
                      attest: bool) -> None:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_small())
        self._small.put_nowait((exchange, body, compact_header, future, attest))

    def _reading(self, exchange: Exchange, body: bytes, compact_header: bool) -> asyncio.Future:
        reading = asyncio.get_running_loop().create_future()
        size = exchange.body_bytes
        if size <= self.inline_limit:  # about what a hand-off to the pool costs; never waits for a worker,
            self._read_on_loop(exchange, body, compact_header, reading, False)  # so a full backlog leaves it read
        elif size > self.parse_limit or self._queued + size > self.queue_bytes:
            why = "over the parse limit" if size > self.parse_limit else "the attesting backlog was full"
            UNREAD.labels(why).inc()
            self.release(exchange.client, size)
            reading.set_result(_raw_reading(exchange, compact_header, why))
        else:
            self._queued += size
            self._waiting.append((exchange, body, compact_header, reading))
            if self._batches < self.workers:
                self._hand_over()
        return reading

    async def _read_small(self) -> None:
        """Read the small bodies on the loop, one at a time, letting it
        forward and relay between two: when many streams end together (and
        their clients' next requests arrive), those requests' first bytes do
        not wait for every reading of the round. An exchange no earlier
        attestation of its session waits for is attested here too, in turn
        (a task per exchange cost more than its reading)."""
        while True:
            exchange, body, compact_header, future, attest = await self._small.get()
            read: dict[str, Any] | Exception
            try:
                read = read_request(exchange.wire, body, compact_header)
            except Exception as error:  # noqa: BLE001 - reported by _attest, as a worker's fault would be
                read = error
            self.release(exchange.client, exchange.body_bytes)
            if attest:  # no earlier attestation of its session waits: handed over now, in turn
                await self._attest(exchange, read)
                future.set_result(None)
            elif isinstance(read, Exception):
                future.set_exception(read)
            else:
                future.set_result(read)
            await asyncio.sleep(0)

    def _hand_over(self) -> None:
        """Hand every body waiting to a free worker, as one batch."""
        batch, self._waiting = self._waiting, []
        entries = [(exchange.wire, body, compact_header) for exchange, body, compact_header, _ in batch]
        loop = asyncio.get_running_loop()
        try:
            read = loop.run_in_executor(self._pool, _read_batch, read_request, entries)
        except BrokenProcessPool:  # a worker died (killed, out of memory): a new pool for this and later ones
            log.error("the gateway's attesting workers died; starting new ones")
            self._pool.shutdown(wait=False)
            self._pool = _pool(self.workers)
            read = loop.run_in_executor(self._pool, _read_batch, read_request, entries)
        self._batches += 1
        read.add_done_callback(lambda done: self._read(batch, done))

    def _read(self, batch: list[tuple[Exchange, bytes, bool, asyncio.Future]], done: asyncio.Future) -> None:
        self._batches -= 1
        if done.cancelled():
            readings: list[Any] = [None] * len(batch)
        else:  # the batch's own fault (a worker died) is each of its exchanges'
            readings = [done.exception()] * len(batch) if done.exception() else done.result()
        for (exchange, _, _, reading), read in zip(batch, readings):
            self._queued -= exchange.body_bytes
            self.release(exchange.client, exchange.body_bytes)
            if done.cancelled():
                reading.cancel()
            elif isinstance(read, BaseException):
                reading.set_exception(read)
            else:
                reading.set_result(read)
        if self._waiting and self._batches < self.workers:
            self._hand_over()

    async def _attest_later(self, exchange: Exchange, reading: asyncio.Future, earlier: asyncio.Future[Any] | None
                            ) -> None:
        """Attest an exchange once it is read and its session's earlier attestation is handed over."""
        if earlier is not None and not earlier.done():
            await asyncio.wait([earlier])  # the session's earlier attestation first, whatever became of it
        read: dict[str, Any] | Exception
        try:
            read = await reading
        except Exception as error:  # noqa: BLE001 - reported by _attest for this exchange alone
            read = error
        await self._attest(exchange, read)

    async def _attest(self, exchange: Exchange, read: dict[str, Any] | Exception) -> None:
        try:
            if isinstance(read, Exception):
                raise read
            _requests(exchange.wire, read["kind"], exchange.outcome).inc()
            await self._publish(exchange, exchange.value(self.instance, read))
        except Exception:  # noqa: BLE001 - a fault of ours in one exchange must not stop the others' attestations
            _FAILED.inc()
            log.exception("session %r arrival %d (%s) was not attested", exchange.session_id, exchange.arrival,
                          exchange.wire)

    async def _publish(self, exchange: Exchange, value: dict[str, Any]) -> None:
        try:
            await self.attest(wire_attestation_record(exchange.session_id, exchange.arrival, encode_json(value)))
            _SENT.inc()
        except Exception as error:  # noqa: BLE001 - the agent's exchange is over; say what was lost, go on
            _FAILED.inc()
            log.error("the attestation of session %r arrival %d (%s) was not published: %s", exchange.session_id,
                      exchange.arrival, exchange.wire, error)

    async def aclose(self) -> None:
        """Attest every exchange that is over, then stop the workers."""
        while self._attesting:
            await asyncio.wait(set(self._attesting))
        if self._reader is not None:
            self._reader.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
