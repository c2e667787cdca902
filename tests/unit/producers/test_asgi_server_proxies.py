"""Whose word the servers take for a client's address: a real uvicorn
listener (no broker) in front of the read API, its sign-in throttle keyed
by that address. Without a trusted proxy, another user of this host who
names a new ``X-Forwarded-For`` on every guess is still the one address
it connects from."""

from __future__ import annotations

import asyncio

import httpx

from dsh_pipeline.web import browser_sessions, read_api
from producers.asgi_server import AsgiServer
from tests.fake_reader import FakeReader

TOKEN = "proxy-test-token"


async def _statuses_of_guesses(trusted_proxies: tuple[str, ...]) -> list[int]:
    """The status of each bearer-token guess, each from a new forwarded address, then the right token's."""
    app = read_api(FakeReader([], [], []), frozenset({TOKEN}))
    async with AsgiServer(app, "the read API", trusted_proxies=trusted_proxies) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        statuses = []
        for guess in range(browser_sessions.MAX_FAILURES + 1):
            forwarded = {"X-Forwarded-For": f"198.51.100.{guess}"}
            reply = await client.get("/api/v1/summary", headers={"Authorization": "Bearer guess", **forwarded})
            statuses.append(reply.status_code)
        right = await client.get("/api/v1/summary", headers={"Authorization": f"Bearer {TOKEN}",
                                                             "X-Forwarded-For": "198.51.100.99"})
        return [*statuses, right.status_code]


def test_a_forwarded_address_from_an_untrusted_peer_does_not_slip_past_the_sign_in_throttle():
    statuses = asyncio.run(_statuses_of_guesses(()))
    assert statuses == [401] * browser_sessions.MAX_FAILURES + [429, 429]


def test_a_trusted_proxys_forwarded_address_is_the_clients():
    statuses = asyncio.run(_statuses_of_guesses(("127.0.0.1",)))
    assert statuses == [401] * (browser_sessions.MAX_FAILURES + 1) + [200]
