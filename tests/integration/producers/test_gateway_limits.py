"""Slow, large and many clients, on the wire (uvicorn on a real port, a real
upstream socket behind it): a request head or body that does not arrive in
time is cut off, bodies beyond the size and memory limits and connections
beyond the limit are refused, none of it reaching the upstream; and reading
one exchange's large request for its attestation never delays another
client's bytes (it runs in worker processes, and past the parse limit is
not done at all: the body's own digest is attested)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time

import httpx
from prometheus_client import REGISTRY

from dsh_core.wire_request import ALGORITHM, RAW_ALGORITHM, normalize, wire_digest
from dsh_kafka.config import Secret
from producers.asgi_server import AsgiServer
from producers.gateway import LISTENER_LIMITS, Gateway, GatewayConfig
from producers.gateway_admission import CREDENTIAL_HEADER, Credentials
from tests.waiting import until
from tests.wire_upstream import WireUpstream

FLEET = "fleet-91c3e0a7d25b4f68"
HEADERS = {CREDENTIAL_HEADER: FLEET, "x-deepseek-harness-session-id": "s"}
#: Three more clients of the fleet, by name.
OTHERS = {name: f"{name}-credential-5d0e8a17" for name in ("one", "two", "three")}


def _gateway(upstream: str, records: list, *, header_timeout: float = 10.0, max_connections: int = 1024,
             **config) -> AsgiServer:
    async def attest(record) -> None:
        records.append(record)
    clients = {"ci": Secret(FLEET)} | {name: Secret(secret) for name, secret in OTHERS.items()}
    gateway = Gateway(GatewayConfig(upstream=upstream, credentials=Credentials(clients), **config), attest)
    limits = dataclasses.replace(LISTENER_LIMITS, head_seconds=header_timeout, max_connections=max_connections)
    return AsgiServer(gateway, "the gateway", limits=limits)


async def _connect(server: AsgiServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = server.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def _head(content_length: int, credential: str = FLEET) -> bytes:
    return (f"POST /v1/messages HTTP/1.1\r\nhost: x\r\n{CREDENTIAL_HEADER}: {credential}\r\n"
            f"x-deepseek-harness-session-id: s\r\ncontent-length: {content_length}\r\n\r\n").encode()


def _body_bytes() -> float | None:
    return REGISTRY.get_sample_value("dsh_gateway_body_bytes")


def _messages(text_bytes: int) -> bytes:
    """A valid Messages request of about ``text_bytes``: many short turns."""
    turns = [{"role": role, "content": [{"type": "text", "text": f"{role} turn {index}: and so on."}]}
             for index in range(text_bytes // 100) for role in ("user", "assistant")]
    return json.dumps({"model": "deepseek-v4-flash", "max_tokens": 64, "stream": True,
                       "messages": turns + [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}).encode()


def test_a_head_or_body_that_does_not_arrive_in_time_is_cut_off_and_not_forwarded():
    async def scenario(upstream: WireUpstream) -> tuple[bytes, bytes, bytes, float]:
        async with _gateway(upstream.url, [], header_timeout=0.5, body_timeout=0.5) as server:
            started = time.monotonic()
            silent_reader, silent_writer = await _connect(server)  # says nothing
            slow_reader, slow = await _connect(server)

            async def trickle() -> None:  # a head, a line every 0.1 s, for as long as the connection lasts
                slow.write(_head(100)[:40])
                while not slow.is_closing():
                    await asyncio.sleep(0.1)  # wait-ok: the slow client's pace is what is tested
                    slow.write(b"x-more: y\r\n")
            trickling = asyncio.create_task(trickle())
            silent, cut = await asyncio.wait_for(asyncio.gather(silent_reader.read(), slow_reader.read()), 10)
            elapsed = time.monotonic() - started
            trickling.cancel()
            body_reader, body_writer = await _connect(server)
            body_writer.write(_head(100) + b'{"model": ')  # a tenth of its body, then nothing
            stalled = await asyncio.wait_for(body_reader.read(), 10)
            for writer in (silent_writer, slow, body_writer):
                writer.close()
        return silent, cut, stalled, elapsed

    with WireUpstream() as upstream:
        silent, cut, stalled, elapsed = asyncio.run(scenario(upstream))
        assert upstream.received == []
    assert silent == b"" and cut == b"" and elapsed < 5
    assert stalled.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 0.5 s" in stalled


def test_bodies_beyond_the_size_and_memory_limits_and_connections_beyond_the_limit_are_refused():
    async def scenario(upstream: WireUpstream) -> list[int]:
        statuses = []
        async with _gateway(upstream.url, [], max_body_bytes=2 << 20, body_memory_bytes=3 << 20,
                            max_connections=4) as server, httpx.AsyncClient(timeout=30) as client:
            oversized = await client.post(f"{server.url}/v1/messages", content=b" " * (3 << 20), headers=HEADERS)
            statuses.append(oversized.status_code)
            holders = []
            for credential in OTHERS.values():  # three clients, each with 1 MiB of its body sent, the rest held back
                reader, writer = await _connect(server)
                writer.write(_head(1 << 20, credential) + b" " * ((1 << 20) - 1))
                holders.append((reader, writer))
            await until(lambda: _body_bytes() == 3 << 20, 10, "3 MiB held")  # each body counted whole at once
            crowded = await client.post(f"{server.url}/v1/messages", json={"model": "m"}, headers=HEADERS)
            statuses.append(crowded.status_code)  # 4 connections open: over the limit
            reader, writer = holders.pop()
            writer.close()
            await until(lambda: _body_bytes() == 2 << 20, 10, "its bytes given back")
            async with httpx.AsyncClient(timeout=30) as fresh:  # a connection of its own: 3 open with it
                over_memory = await fresh.post(f"{server.url}/v1/messages", content=b" " * (3 << 19),
                                               headers=HEADERS)  # 1.5 MiB: within its own limit, not the gateway's
            statuses.append(over_memory.status_code)
            for reader, writer in holders:
                writer.write(b" ")  # the last byte: each is forwarded now
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
                writer.close()
        return statuses

    with WireUpstream() as upstream:
        statuses = asyncio.run(scenario(upstream))
        forwarded = len(upstream.received)
    assert statuses == [413, 503, 503]
    assert forwarded == 2


def test_a_large_request_never_delays_another_clients_bytes_and_past_the_limits_is_attested_by_its_digest():
    large = _messages(2 << 20)  # 3.8 MiB: seconds of work to read

    async def scenario(upstream: WireUpstream) -> tuple[list, float]:
        records: list = []
        async with _gateway(upstream.url, records, parse_limit_bytes=4 << 20) as server, \
                httpx.AsyncClient(timeout=60) as client:
            small = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            await client.post(f"{server.url}/v1/messages", json=small, headers=HEADERS)  # connections warm
            first_bytes: list[float] = []  # of another client, from before the large request until it is attested

            async def another_client() -> None:
                async with httpx.AsyncClient(timeout=60) as other:
                    while not any(record.session_id == "large" for record in records):
                        started = time.monotonic()
                        async with other.stream("POST", f"{server.url}/v1/messages", json=small,
                                                headers={**HEADERS, "x-deepseek-harness-session-id": "other"}) as reply:
                            async for _ in reply.aiter_raw():
                                first_bytes.append(time.monotonic() - started)
                                break
            probing = asyncio.create_task(another_client())
            await until(lambda: first_bytes, 10, "the other client's first answer")
            answer = await client.post(f"{server.url}/v1/messages", content=large,
                                       headers={**HEADERS, "x-deepseek-harness-session-id": "large"})
            assert answer.status_code == 200
            await asyncio.wait_for(probing, 120)
            slowest = max(first_bytes)
        for unread, limits in enumerate(({"parse_limit_bytes": 1 << 20}, {"attest_queue_bytes": 1 << 20}), 1):
            async with _gateway(upstream.url, records, **limits) as server, httpx.AsyncClient(timeout=60) as client:
                await client.post(f"{server.url}/v1/messages", content=large, headers=HEADERS)
                await until(lambda: sum(json.loads(r.value)["algorithm"] == RAW_ALGORITHM for r in records) == unread,
                            30, "the bytes' digest")
        return records, slowest

    with WireUpstream() as upstream:
        records, slowest = asyncio.run(scenario(upstream))
    attested = [json.loads(record.value) for record in records]
    read = next(json.loads(record.value) for record in records if record.session_id == "large")
    assert (read["algorithm"], read["digest"]) == (ALGORITHM, wire_digest(normalize("messages", json.loads(large))))
    assert slowest < 1.0, f"a client's first byte waited {slowest:.2f} s behind another's attestation"
    for raw, why in zip(attested[-2:], ("over the parse limit", "the attesting backlog was full")):
        assert (raw["algorithm"], raw["digest"], raw["bytes"], raw["kind"], raw["parts"], raw["unread"]) == (
            RAW_ALGORITHM, hashlib.sha256(large).hexdigest(), len(large), "agent", None, why)


def test_one_client_holding_back_bodies_leaves_the_others_room():
    """A client of the fleet declares body after body of the largest size
    and sends none of them: it fills at most three quarters of the gateway's
    body memory, and another client's request is still forwarded."""
    async def scenario(upstream: WireUpstream) -> tuple[list[bytes], int]:
        async with _gateway(upstream.url, [], max_body_bytes=1 << 20, body_memory_bytes=8 << 20) as server, \
                httpx.AsyncClient(timeout=30) as client:
            holders, refusals = [], []
            for _ in range(8):  # as many as the whole memory holds
                reader, writer = await _connect(server)
                writer.write(_head(1 << 20))
                holders.append((reader, writer))
            await until(lambda: _body_bytes() == 6 << 20, 10, "the client's share held")
            for reader, writer in holders[6:]:
                refusals.append(await asyncio.wait_for(reader.readuntil(b"\r\n"), 10))
            other = await client.post(f"{server.url}/v1/messages", json={"model": "m"},
                                      headers={**HEADERS, CREDENTIAL_HEADER: OTHERS["one"]})
            for _, writer in holders:
                writer.close()
        return refusals, other.status_code

    with WireUpstream() as upstream:
        refusals, status = asyncio.run(scenario(upstream))
    assert refusals == [b"HTTP/1.1 503 Service Unavailable\r\n"] * 2
    assert status == 200
