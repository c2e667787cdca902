"""The gateway's attesting of finished exchanges, without a server: a
small body is read on the loop whatever backlog other clients' large bodies
made, so one client's large requests never leave another's unchecked."""

from __future__ import annotations

import asyncio
import json

from dsh_core.wire_request import ALGORITHM, normalize, wire_digest
from producers.gateway_attest import Attesting, Exchange


def test_a_small_body_is_read_while_large_ones_fill_the_backlog():
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()

    async def scenario() -> dict:
        released: list[int] = []

        async def attest(record) -> None:
            pass

        attesting = Attesting("g", attest, workers=1, inline_limit=2048, parse_limit=8 << 20, queue_bytes=4 << 20,
                              release=lambda client, size: released.append(size))
        try:
            attesting._queued = 4 << 20  # other clients' large bodies wait for the worker
            exchange = Exchange("messages", "small", 1, "client")
            exchange.body_bytes = len(body)
            reading = await attesting._reading(exchange, body, False)
            assert released == [len(body)]
            return reading
        finally:
            attesting._pool.shutdown()

    reading = asyncio.run(scenario())
    assert (reading["algorithm"], reading["digest"], reading.get("unread")) == (
        ALGORITHM, wire_digest(normalize("messages", json.loads(body))), None)
