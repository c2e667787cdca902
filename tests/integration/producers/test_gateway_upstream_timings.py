"""The gateway's attestation carries its upstream timings: how long the
upstream took to its response headers and to the last byte relayed, by the
gateway's own monotonic clock (an exchange the upstream never answered has
none: test_gateway_wire's unreachable upstream)."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.producers.test_gateway_wire import BODY, _attested, _gateway, _headers
from tests.waiting import until
from tests.wire_upstream import WireUpstream


def test_an_attestation_carries_the_upstream_first_byte_and_duration():
    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url, read_timeout=1.0)
        async with server, httpx.AsyncClient(timeout=30) as client:
            answered = await client.post(f"{server.url}/v1/messages", json=BODY, headers=_headers("quick"))
            try:  # headers at once, then nothing: the gateway gives up after its 1 s read timeout
                async with client.stream("POST", f"{server.url}/v1/messages", json={**BODY, "scenario": "stall"},
                                         headers=_headers("stalled")) as response:
                    async for _ in response.aiter_raw():
                        pass
            except httpx.HTTPError:
                pass
            await until(lambda: len(records) == 2, 10, "two attestations")
        return answered, records

    with WireUpstream() as upstream:
        answered, records = asyncio.run(scenario(upstream))
    assert answered.status_code == 200
    by_session = {record.session_id: attested for record, attested in zip(records, _attested(records))}
    quick, stalled = by_session["quick"]["upstream"], by_session["stalled"]["upstream"]
    assert 0 <= quick["firstByteMs"] <= quick["durationMs"] < 1000
    assert by_session["stalled"]["outcome"] == "upstream-stalled"
    assert stalled["firstByteMs"] < 1000 <= stalled["durationMs"]  # the headers came; the body never ended

