"""The gateway on the wire: uvicorn serving it on a real port, in front of
a real upstream socket (:mod:`tests.wire_upstream`). Responses arrive byte
for byte as the upstream wrote them, errors included; a client that goes
away, an upstream that stalls or resets, and an upstream that is not there
leave the gateway serving and are attested as what happened; exchanges
over when it stops are attested before it is gone; secrets reach the
upstream and nothing else."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest

from dsh_core.wire_request import normalize, wire_digest
from dsh_kafka.config import Secret
from producers.asgi_server import AsgiServer
from producers.gateway import Gateway, GatewayConfig
from producers.gateway_admission import CREDENTIAL_HEADER, Credentials
from producers.gateway_attest import read_request
from tests.waiting import until, wait_for
from tests.wire_upstream import WireUpstream, sse_bytes

SECRET = "sk-test-4c1d2e9f0a7b"
FLEET = "fleet-7d0c4f1e2b9a6358"
CREDENTIALS = Credentials({"agents": Secret(FLEET)})
BODY = {"model": "deepseek-v4-flash", "max_tokens": 64, "stream": True, "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]}


def _headers(session: str) -> dict[str, str]:
    return {"x-deepseek-harness-session-id": session, "authorization": f"Bearer {SECRET}", "x-api-key": SECRET,
            CREDENTIAL_HEADER: FLEET}


async def _gateway(upstream: str, **config):
    records = []

    async def attest(record) -> None:
        records.append(record)

    server = AsgiServer(Gateway(GatewayConfig(upstream=upstream, credentials=CREDENTIALS, **config), attest),
                        "the gateway")
    return server, records


def _attested(records) -> list[dict]:
    return [json.loads(record.value) for record in records]


def test_responses_arrive_as_the_upstream_wrote_them_under_many_streams():
    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url)
        async with server, httpx.AsyncClient(timeout=30) as client:
            async def fetch(base: str, index: int, scenario: str) -> tuple[int, str, bytes]:
                body = {**BODY, "scenario": scenario}
                async with client.stream("POST", f"{base}/v1/messages", json=body,
                                         headers=_headers(f"s-{index % 7}")) as response:
                    return (response.status_code, response.headers.get("content-type"),
                            b"".join([chunk async for chunk in response.aiter_raw()]))
            direct = [await fetch(upstream.url, 0, s) for s in ("sse", "error", "gzip")]
            through = await asyncio.gather(*(fetch(server.url, i, ("sse", "error", "gzip")[i % 3]) for i in range(60)))
            await until(lambda: len(records) == 60, 10, "60 attestations")
        return direct, through, records

    with WireUpstream() as upstream:
        direct, through, records = asyncio.run(scenario(upstream))
    assert direct[0][2] == sse_bytes() and direct[1][0] == 500 and direct[2][2][:2] == b"\x1f\x8b"
    for index, answer in enumerate(through):
        assert answer == direct[index % 3], index
    attested = _attested(records)
    assert {(a["status"], a["outcome"]) for a in attested} == {(200, "completed"), (500, "completed")}
    assert all(a["digest"] == wire_digest(normalize("messages", BODY)) and a["kind"] == "agent" for a in attested)
    assert sorted(record.seq for record in records) == list(range(1, 61))  # the gateway's arrivals, each once
    assert {a["client"] for a in attested} == {"agents"}


def test_a_client_that_goes_away_and_a_stalled_or_reset_upstream_leave_the_gateway_serving():
    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url, read_timeout=1.0)
        async with server, httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{server.url}/v1/messages", json={**BODY, "scenario": "stall"},
                                     headers=_headers("gone")) as response:
                async for _ in response.aiter_raw():
                    break  # the first bytes arrived; the client leaves
            await until(lambda: len(records) == 1, 10, "the abandoned exchange's attestation")
            broken = []
            for case in ("stall", "reset"):
                with pytest.raises(httpx.HTTPError) as raised:
                    async with client.stream("POST", f"{server.url}/v1/messages", json={**BODY, "scenario": case},
                                             headers=_headers(case)) as response:
                        async for _ in response.aiter_raw():
                            pass
                broken.append(type(raised.value).__name__)
            after = await client.post(f"{server.url}/v1/messages", json=BODY, headers=_headers("after"))
            await until(lambda: len(records) == 4, 10, "four attestations")
        return records, broken, after

    with WireUpstream() as upstream:
        records, broken, after = asyncio.run(scenario(upstream))
    assert after.status_code == 200 and after.content == sse_bytes()
    outcomes = {record.session_id: json.loads(record.value)["outcome"] for record in records}
    assert outcomes == {"gone": "client-disconnected", "stall": "upstream-stalled", "reset": "upstream-reset",
                        "after": "completed"}, outcomes
    assert broken == ["RemoteProtocolError", "RemoteProtocolError"]  # the stream breaks off, as upstream's did


def test_an_unreachable_upstream_is_answered_and_attested():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"

    async def scenario():
        server, records = await _gateway(closed)
        async with server, httpx.AsyncClient(timeout=30) as client:
            answer = await client.post(f"{server.url}/chat/completions",
                                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                                       headers=_headers("lonely"))
            await until(lambda: records, 10, "the attestation")
        return answer, records

    answer, records = asyncio.run(scenario())
    assert answer.status_code == 502 and "unreachable" in answer.json()["error"]["message"]
    [attested] = _attested(records)
    assert (attested["wire"], attested["status"], attested["outcome"]) == ("chat-completions", None,
                                                                          "upstream-unreachable")
    assert "upstream" not in attested  # no upstream timings: it never answered


def test_a_body_that_is_no_model_request_is_forwarded_and_attested_with_its_problem():
    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url)
        async with server, httpx.AsyncClient(timeout=30) as client:
            answers = [await client.post(f"{server.url}/v1/messages", content=body, headers=_headers(f"odd-{index}"))
                       for index, body in enumerate((b'{"messages": [1, "two"]}', b"not json"))]
            await until(lambda: len(records) == 2, 10, "two attestations")
        return answers, records

    with WireUpstream() as upstream:
        answers, records = asyncio.run(scenario(upstream))
    assert [answer.status_code for answer in answers] == [200, 200]  # the upstream judges, not the gateway
    problems = {record.session_id: json.loads(record.value)["problem"] for record in records}
    assert problems["odd-0"].startswith("the request body is not a messages request (AttributeError")
    assert problems["odd-1"].startswith("the request body is not a JSON object")
    assert all(json.loads(record.value)["digest"] is None for record in records)


def test_secrets_reach_the_upstream_and_no_record_log_line_or_metric(caplog):
    caplog.set_level(logging.DEBUG)

    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url, read_timeout=1.0)
        async with server, httpx.AsyncClient(timeout=30) as client:
            for case in ("sse", "error", "reset"):
                try:
                    await client.post(f"{server.url}/v1/messages", json={**BODY, "scenario": case},
                                      headers=_headers("secret-" + case))
                except httpx.HTTPError:
                    pass
            await client.post(f"{server.url}/v1/messages", json=BODY, headers={"authorization": f"Bearer {SECRET}",
                                                                                CREDENTIAL_HEADER: FLEET})
            await until(lambda: len(records) == 3, 10, "three attestations")
        return records

    with WireUpstream() as upstream:
        records = asyncio.run(scenario(upstream))
        assert all(headers["authorization"] == f"Bearer {SECRET}" and headers["x-api-key"] == SECRET
                   and CREDENTIAL_HEADER not in headers for headers, _ in upstream.received[:3])
    everything = b"".join(r.key + r.value + b"".join(k.encode() + v for k, v in r.headers) for r in records)
    for secret in (SECRET, FLEET):
        assert secret.encode() not in everything
        assert caplog.records and secret not in caplog.text
        assert secret.encode() not in generate_latest(REGISTRY)


def _read_or_fail(wire, body, compact_header):
    """The gateway's reading of a request, failing on one, and reading one
    only once a file exists (at once, or in its worker processes)."""
    system = json.loads(body).get("system")
    if system == "fail here":
        raise RuntimeError("a fault of the gateway's own")
    if system.startswith("read once there is "):
        wait_for(Path(system.removeprefix("read once there is ")).exists, 30, "the test's go-ahead")
    return read_request(wire, body, compact_header)


@pytest.mark.parametrize("inline_read_bytes", [2048, 0], ids=["read-at-once", "read-by-the-pool"])
def test_exchanges_over_when_the_gateway_stops_are_attested_and_a_fault_in_one_spares_the_rest(
        monkeypatch, caplog, inline_read_bytes):
    from producers import gateway_attest
    monkeypatch.setattr(gateway_attest, "read_request", _read_or_fail)
    hand_overs = _count_hand_overs(monkeypatch)

    async def scenario(upstream: WireUpstream):
        records, publishing = [], asyncio.Event()

        async def attest(record) -> None:  # Kafka, slow to take the first: exchanges queue up behind it
            await publishing.wait()
            records.append(record)

        gateway = Gateway(GatewayConfig(upstream=upstream.url, credentials=CREDENTIALS,
                                        inline_read_bytes=inline_read_bytes), attest)
        closing = gateway.aclose

        async def aclose() -> None:  # the server has stopped: Kafka takes records again
            publishing.set()
            await closing()
        gateway.aclose = aclose
        async with AsgiServer(gateway, "the gateway") as server, httpx.AsyncClient(timeout=30) as client:
            await client.post(f"{server.url}/v1/messages", json={**BODY, "system": "fail here"}, headers=_headers("bad"))
            answers = await asyncio.gather(*(client.post(f"{server.url}/v1/messages", json=BODY,
                                                         headers=_headers(f"ok-{index}")) for index in range(20)))
        return answers, list(records)  # as the stopped gateway left them

    with WireUpstream() as upstream:
        answers, records = asyncio.run(scenario(upstream))
    assert [answer.status_code for answer in answers] == [200] * 20
    assert sorted(record.session_id for record in records) == sorted(f"ok-{index}" for index in range(20))
    assert "session 'bad' arrival 1 (messages) was not attested" in caplog.text
    assert (sum(hand_overs) == 21) is (inline_read_bytes == 0)  # bodies of 200 bytes: read at once, or all in the pool


def _count_hand_overs(monkeypatch) -> list[int]:
    """The number of bodies in each batch the gateway hands to its attesting pool."""
    from producers.gateway_attest import Attesting
    hand_overs: list[int] = []
    hand_over = Attesting._hand_over
    monkeypatch.setattr(Attesting, "_hand_over", lambda self: hand_overs.append(len(self._waiting)) or hand_over(self))
    return hand_overs


def test_bodies_waiting_for_a_busy_worker_are_read_as_one_batch_and_a_fault_in_one_spares_the_rest(
        monkeypatch, caplog, tmp_path):
    from producers import gateway_attest
    monkeypatch.setattr(gateway_attest, "read_request", _read_or_fail)
    hand_overs = _count_hand_overs(monkeypatch)
    go_ahead = tmp_path / "go-ahead"

    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url, inline_read_bytes=0, attest_workers=1)
        async with server, httpx.AsyncClient(timeout=30) as client:
            await client.post(f"{server.url}/v1/messages", json={**BODY, "system": f"read once there is {go_ahead}"},
                              headers=_headers("first"))  # the one worker reads this one until told to go on
            answers = await asyncio.gather(*(client.post(f"{server.url}/v1/messages", json=BODY if index else
                                                         {**BODY, "system": "fail here"}, headers=_headers(f"s-{index}"))
                                             for index in range(20)))
            await until(lambda: len(server.app._attesting._waiting) == 20, 10, "20 bodies waiting behind the first")
            go_ahead.touch()
            await until(lambda: len(records) == 20, 30, "20 attestations")
        return answers, records

    with WireUpstream() as upstream:
        answers, records = asyncio.run(scenario(upstream))
    assert [answer.status_code for answer in answers] == [200] * 20
    assert hand_overs == [1, 20]  # the first body alone, then the 20 that waited for the worker, together
    assert sorted(record.session_id for record in records) == sorted(["first"] + [f"s-{i}" for i in range(1, 20)])
    assert "session 's-0' arrival 2 (messages) was not attested" in caplog.text


def test_a_stream_the_stopping_server_cuts_off_is_attested_as_such():
    async def scenario(upstream: WireUpstream):
        server, records = await _gateway(upstream.url)
        first_bytes = asyncio.Event()
        async with httpx.AsyncClient(timeout=30) as client:
            async def stalled() -> None:
                async with client.stream("POST", f"{server.url}/v1/messages", json={**BODY, "scenario": "stall"},
                                         headers=_headers("cut-off")) as response:
                    async for _ in response.aiter_raw():
                        first_bytes.set()

            async with server:
                streaming = asyncio.create_task(stalled())
                await asyncio.wait_for(first_bytes.wait(), 10)
            # the server has stopped (its grace ran out on the stalled stream) and the gateway closed
            attested = list(records)
            streaming.cancel()
            await asyncio.gather(streaming, return_exceptions=True)
        return attested

    with WireUpstream() as upstream:
        records = asyncio.run(scenario(upstream))
    assert [(record.session_id, json.loads(record.value)["outcome"]) for record in records] == [
        ("cut-off", "gateway-stopped")]
