"""What the gateway lets through, on the wire (uvicorn on a real port, a
real upstream socket behind it): only the fleet's clients, with their
credential taken out and the upstream's key put in where configured; only
paths that are normal and classified, inside the upstream's prefix; a
session id as the agent named it; each session within its rate, and the
per-session state bounded. What is refused never reaches the upstream."""

from __future__ import annotations

import asyncio
import json
import shutil
from urllib.parse import unquote

import httpx
import pytest
from prometheus_client import REGISTRY

from dsh_kafka.config import Secret
from producers.asgi_server import AsgiServer
from producers.gateway import Gateway, GatewayConfig
from producers.gateway_admission import CREDENTIAL_HEADER, Credentials
from tests.waiting import until
from tests.wire_upstream import WireUpstream

FLEET = "fleet-5b0e2d7c9a14f683"
UPSTREAM_KEY = "sk-upstream-0f3a9c2e71"
BODY = {"model": "deepseek-v4-flash", "max_tokens": 64, "stream": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]}


def _gateway(upstream: str, records: list, **config) -> AsgiServer:
    async def attest(record) -> None:
        records.append(record)
    gateway = Gateway(GatewayConfig(upstream=upstream, credentials=Credentials({"ci-agents": Secret(FLEET)}), **config),
                      attest)
    return AsgiServer(gateway, "the gateway")


def test_only_the_fleets_clients_are_forwarded_and_their_credential_never_is():
    async def scenario(upstream: WireUpstream) -> tuple[list, list, list]:
        records: list = []
        answers = []
        async with _gateway(upstream.url, records) as server, httpx.AsyncClient(timeout=30) as client:
            for headers in ({}, {CREDENTIAL_HEADER: "fleet-guessed-000000000"}, {"authorization": f"Bearer {FLEET}"}):
                answers.append(await client.post(f"{server.url}/v1/messages", json=BODY,
                                                 headers={"x-deepseek-harness-session-id": "victim", **headers}))
            answers.append(await client.get(f"{server.url}/v1/models"))
            assert upstream.received == []  # nothing refused was forwarded
            answers.append(await client.post(f"{server.url}/v1/messages", json=BODY, headers={
                "x-deepseek-harness-session-id": "mine", CREDENTIAL_HEADER: FLEET, "x-api-key": "sk-agents-own"}))
            answers.append(await client.post(f"{server.url}/v1/messages", json={**BODY, "scenario": "refuse"}, headers={
                "x-deepseek-harness-session-id": "mine", CREDENTIAL_HEADER: FLEET, "x-api-key": "sk-wrong"}))
            await until(lambda: len(records) == 2, 10, "two attestations")
        keyed: list = []
        async with _gateway(upstream.url, keyed, upstream_key=Secret(UPSTREAM_KEY)) as server, \
                httpx.AsyncClient(timeout=30) as client:
            for headers in ({"authorization": f"Bearer {FLEET}"}, {"x-api-key": FLEET, "authorization": "Basic eDp5"},
                            {"authorization": "Bearer sk-a-key-of-its-own"}):
                answers.append(await client.post(f"{server.url}/v1/messages", json=BODY,
                                                 headers={"x-deepseek-harness-session-id": "keyed", **headers}))
            await until(lambda: len(keyed) == 2, 10, "two attestations")
        return answers, records, keyed

    with WireUpstream() as upstream:
        answers, records, keyed = asyncio.run(scenario(upstream))
        forwarded = [headers for headers, _ in upstream.received]
    assert [answer.status_code for answer in answers] == [401, 401, 401, 401, 200, 401, 200, 200, 401]
    assert "no valid fleet credential in x-dsh-gateway-credential" in answers[0].json()["error"]["message"]
    assert [(h.get("x-api-key"), h.get("authorization"), CREDENTIAL_HEADER in h) for h in forwarded] == [
        ("sk-agents-own", None, False), ("sk-wrong", None, False),  # the upstream's own key passes as it came
        (None, f"Bearer {UPSTREAM_KEY}", False),  # the gateway's key in each API key slot the client filled
        (UPSTREAM_KEY, f"Bearer {UPSTREAM_KEY}", False)]
    attested = [json.loads(record.value) for record in records + keyed]
    assert [(a["client"], a["status"], a["outcome"]) for a in attested] == [
        ("ci-agents", 200, "completed"), ("ci-agents", 401, "refused"), ("ci-agents", 200, "completed"),
        ("ci-agents", 200, "completed")]


@pytest.mark.parametrize("method, path, status", [
    ("POST", "/v1/messages/.", 400), ("POST", "/v1/messages/x/..", 400), ("POST", "/v1/x/%2e%2e/messages", 400),
    ("POST", "/v1/chat%2Fcompletions", 400), ("POST", "/v1//messages", 400), ("POST", "/v1/%252e%252e/messages", 400),
    ("GET", "/../../etc/passwd", 400), ("GET", "/%2E%2E/admin", 400), ("POST", "/v1/messages%00", 400),
    ("POST", "/v1/other", 404), ("PUT", "/v1/messages", 404),
    ("POST", "/v1/%6Dessages", 200), ("GET", "/v1/models", 200)])
def test_a_path_is_forwarded_only_inside_the_prefix_and_classified(method, path, status):
    async def scenario(upstream: WireUpstream) -> tuple[bytes, list]:
        records: list = []
        async with _gateway(upstream.url + "/api", records) as server:
            host, port = server.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            body = json.dumps(BODY).encode()
            writer.write(f"{method} {path} HTTP/1.1\r\nhost: x\r\n{CREDENTIAL_HEADER}: {FLEET}\r\n"
                         f"x-deepseek-harness-session-id: s\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
            head = await reader.readuntil(b"\r\n\r\n")
            writer.close()
            if status == 200 and method == "POST":
                await until(lambda: records, 10, "the attestation")
        return head, records

    with WireUpstream() as upstream:
        head, records = asyncio.run(scenario(upstream))
        paths = list(upstream.paths)
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert paths == ([f"/api{unquote(path)}"] if status == 200 else [])  # never outside the prefix
    assert [json.loads(record.value)["wire"] for record in records] == (["messages"] if method == "POST" and
                                                                        status == 200 else [])


@pytest.mark.skipif(shutil.which("node") is None, reason="node (the dsh runtimes' HTTP client) is not installed")
def test_a_session_id_reaches_the_attestation_key_as_the_agent_named_it():
    names = ["sé-✓-会话", "plain-ascii", "Ünïcode ïd"]

    async def scenario(upstream: WireUpstream) -> list:
        records: list = []
        async with _gateway(upstream.url, records) as server, httpx.AsyncClient(timeout=30) as client:
            for name in names:  # a client that sends UTF-8
                await client.post(f"{server.url}/v1/messages", json=BODY, headers={
                    "x-deepseek-harness-session-id": name.encode(), CREDENTIAL_HEADER: FLEET})
            # dsh runtimes are Node programs: their fetch sends a header's characters as Latin-1 bytes
            script = (f"fetch({server.url + '/v1/messages'!r}, {{method: 'POST', body: {json.dumps(json.dumps(BODY))},"
                      f" headers: {{'x-deepseek-harness-session-id': 'Ünïcode ïd',"
                      f" '{CREDENTIAL_HEADER}': '{FLEET}'}}"
                      f"}}).then(r => r.text()).then(() => process.exit(0))")
            node = await asyncio.create_subprocess_exec("node", "-e", script)
            assert await node.wait() == 0
            await until(lambda: len(records) == 4, 10, "four attestations")
        return records

    with WireUpstream() as upstream:
        records = asyncio.run(scenario(upstream))
    assert [record.session_id for record in records] == names + ["Ünïcode ïd"]
    assert [record.key for record in records] == [name.encode() for name in names + ["Ünïcode ïd"]]


def test_each_session_keeps_to_its_rate_and_the_sessions_kept_are_bounded():
    async def scenario(upstream: WireUpstream) -> tuple[list, list, float]:
        records: list = []
        async with _gateway(upstream.url, records, session_rate=0.001, session_burst=2, sessions_kept=5) as server, \
                httpx.AsyncClient(timeout=30) as client:
            async def post(session: str) -> int:
                answer = await client.post(f"{server.url}/v1/messages", json=BODY, headers={
                    "x-deepseek-harness-session-id": session, CREDENTIAL_HEADER: FLEET})
                return answer.status_code
            statuses = [await post("busy") for _ in range(3)]
            statuses += [await post(f"one-of-many-{index}") for index in range(50)]
            kept = REGISTRY.get_sample_value("dsh_gateway_sessions_kept")
            await until(lambda: len(records) == 52, 10, "52 attestations")
        return statuses, records, kept

    with WireUpstream() as upstream:
        statuses, records, kept = asyncio.run(scenario(upstream))
        forwarded = len(upstream.received)
    assert statuses == [200, 200, 429] + [200] * 50
    assert forwarded == 52 and kept == 5
    assert sum(record.session_id == "busy" for record in records) == 2
