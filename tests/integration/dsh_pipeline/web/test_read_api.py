"""The read API over a store a real pipeline run filled (a simulated fleet
with faults through the broker, the projector with its outcome index and
the auditor): every endpoint's answer equals the ground truth; tokens and
parameters are checked."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import sqlite3
from typing import Any

import httpx
import pytest

from consumers.projector.outcomes import OutcomeIndex, OutcomeIndexConfig
from consumers.projector.store_reader import StoreReader
from dsh_pipeline.web import read_api
from producers.asgi_server import AsgiServer
from dsh_core.formats.v4.session import derive_message
from producers.simulator import FaultPlan, SimulatorConfig, messages_digest
from tests.integration.test_pipeline import expected_findings
from tests.integration.consumers.projector.test_projector import publish_fleet, run_until
from tests.kafka_fixtures import caught_up, end_offsets
from tests.services import auditor, projector

pytestmark = pytest.mark.kafka
TOKEN = "api-test-token"


def _status(truth) -> str:
    kinds = {defect.kind for defect in truth.defects}
    return "held" if "dropped" in kinds else "refused" if "unknown" in kinds else "idle"


async def _pages(client: httpx.AsyncClient, path: str, **params: Any) -> list[dict]:
    items, cursor = [], None
    while True:
        answer = await client.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        items += page["items"]
        if (cursor := page["next"]) is None:
            return items


async def _messages(client: httpx.AsyncClient, session_id: str) -> list[dict]:
    """A session's messages, three events a page, each message cut to a
    preview fetched whole from its event, in the model's order (each
    event's ``order``, then its seq)."""
    messages, after = [], None
    while True:
        answer = await client.get(f"/api/v1/sessions/{session_id}",
                                  params={"limit": 3, **({"after": after} if after is not None else {})})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        cut = {event["seq"] for event in page["surface"] if "preview" in event}
        order = {event["seq"]: event["order"] for event in page["surface"]}
        for message in page["messages"]:
            seq = page["messageSeqs"].get(message.get("id"))
            if seq in cut:
                whole = await client.get(f"/api/v1/events/{seq}", params={"session": session_id})
                assert whole.status_code == 200, whole.text
                message = derive_message(whole.json()["type"], whole.json()["data"])
            messages.append(((order[seq], seq), message))
        if (after := page["next"]) is None:
            return [message for _, message in sorted(messages, key=lambda placed: placed[0])]


def test_every_endpoint_answers_the_ground_truth(kafka, topics, group_id, tmp_path):
    names = topics(partitions=6)
    faults = FaultPlan(unlogged=3, dropped=2, duplicate=2, lossless=2, unknown=2)
    truths = asyncio.run(publish_fleet(kafka, names, SimulatorConfig(sessions=60, seed=35, max_turns=4, faults=faults,
                                                                     formats=(0, 3, 4))))
    expected = expected_findings(truths)
    db = tmp_path / "views.sqlite"
    clean = [truth for truth in truths if not truth.defects]

    def audit_of(truth) -> dict | None:  # a clean session's counts: each attestation verified (none: no row)
        return {"attested": {"verified": truth.attestations}, "wire": {}} if truth.attestations else None

    def audited() -> bool:  # every clean session's verdict counts indexed
        with contextlib.closing(sqlite3.connect(db)) as connection:
            rows = dict(connection.execute("SELECT session_id, counts FROM audit_verdicts"))
        return all(json.loads(rows.get(truth.session_id, "null")) == audit_of(truth) for truth in clean)

    def indexed() -> tuple[int, int]:
        reader = StoreReader(db)
        try:
            counts = reader.counts()
            return counts["findings"], counts["deadLetters"]
        finally:
            reader.close()

    async def fill() -> None:
        ends = await end_offsets(kafka, names.events)
        projecting = projector(kafka, names, group_id("projector"), db)
        auditing = auditor(kafka, names, group_id("auditor"), state=tmp_path / "auditor.sqlite", checkpoint_seconds=0)
        await asyncio.gather(run_until(projecting, lambda: caught_up(projecting, ends)),
                             run_until(auditing, lambda: caught_up(auditing, ends)))
        await run_until(OutcomeIndex(OutcomeIndexConfig(kafka=kafka, topics=names, group=group_id("outcomes"),
                                                        store=db)),
                        lambda: db.exists() and indexed()[0] == sum(expected.values()) and audited())

    asyncio.run(fill())

    async def ask() -> None:
        reader = StoreReader(db)
        try:
            async with AsgiServer(read_api(reader, frozenset({TOKEN}), max_page=25), "the read API") as server:
                async with httpx.AsyncClient(base_url=server.url) as anonymous:
                    for path in ("/api/v1/sessions", "/api/v1/findings", "/api/v1/summary"):
                        assert (await anonymous.get(path)).status_code == 401
                        wrong = await anonymous.get(path, headers={"Authorization": "Bearer nope"})
                        assert wrong.status_code == 401 and "bearer token" in wrong.json()["error"]
                    assert (await anonymous.get("/healthz")).status_code == 200
                    assert (await anonymous.get("/api/v1/openapi.json")).status_code == 401
                    assert "access-control-allow-origin" not in (await anonymous.get(
                        "/api/v1/sessions", headers={"Origin": "https://elsewhere.example"})).headers
                async with httpx.AsyncClient(base_url=server.url,
                                             headers={"Authorization": f"Bearer {TOKEN}"}) as client:
                    await _check(client, reader)
        finally:
            reader.close()

    async def _check(client: httpx.AsyncClient, reader: StoreReader) -> None:
        listed = await _pages(client, "/api/v1/sessions", limit=25)
        assert sorted(item["sessionId"] for item in listed) == sorted(truth.session_id for truth in truths)
        by_status = collections.Counter(_status(truth) for truth in truths)
        assert (await client.get("/api/v1/summary")).json()["sessionsByStatus"] == dict(by_status)
        for status, count in by_status.items():
            assert len(await _pages(client, "/api/v1/sessions", status=status)) == count
        for truth in clean[:8]:
            session = (await client.get(f"/api/v1/sessions/{truth.session_id}")).json()
            whole = reader.session(truth.session_id)  # dsh's history, as `view --json` prints it
            assert messages_digest(whole["messages"]) == truth.messages_digest
            # the pages' messages put in the model's order by their events' `order` are dsh's history
            assert await _messages(client, truth.session_id) == whole["messages"]
            assert session["nextSeq"] == truth.next_seq and len(session["turns"]) == truth.turns
            assert session["audit"] == audit_of(truth)
        for truth in [truth for truth in truths if [d.kind for d in truth.defects] == ["unlogged"]]:
            session = (await client.get(f"/api/v1/sessions/{truth.session_id}")).json()
            verified = {"verified": truth.attestations - 1} if truth.attestations > 1 else {}
            assert session["audit"]["attested"] == {"mismatch": 1, **verified}
        findings = await _pages(client, "/api/v1/findings", limit=7)
        assert collections.Counter((f["sessionId"], f["rule"], f["seq"]) for f in findings) == expected
        flagged = {f["sessionId"] for f in findings}
        assert {i["sessionId"] for i in await _pages(client, "/api/v1/sessions", has_findings="true")} == flagged
        letters = await _pages(client, "/api/v1/dead-letters")
        assert letters and {letter["service"] for letter in letters} <= {"projector", "auditor"}
        one = (await client.get(f"/api/v1/dead-letters/{letters[0]['id']}")).json()
        assert one["id"] == letters[0]["id"] and one["reason"] == letters[0]["reason"]
        for path, parameter in (("/api/v1/sessions?status=bogus", "status"),
                                ("/api/v1/sessions?created_from=yesterday", "created_from"),
                                ("/api/v1/sessions?limit=26", "limit"), ("/api/v1/findings?severity=fatal", "severity"),
                                ("/api/v1/sessions?cursor=forged", "cursor")):
            answer = await client.get(path)
            assert answer.status_code == 422 and f"query parameter '{parameter}'" in answer.json()["error"], path
        missing = await client.get("/api/v1/sessions/no-such-session")
        assert missing.status_code == 404 and "no-such-session" in missing.json()["error"]
        assert (await client.get("/api/v1/sessions", params={"q": "x" * 5000})).status_code == 414
        assert (await client.post("/api/v1/sessions")).status_code == 405
        assert (await client.get("/api/v1/openapi.json")).json()["info"]["title"] == "dsh-pipeline read API"

    asyncio.run(ask())


def test_a_store_that_goes_away_is_a_503_and_the_api_stays_up(tmp_path):
    from dsh_pipeline.local_postgres import create_database
    from tests.postgres_fixture import local_postgres_or_skip
    from tests.view_store_helpers import stored_fleet

    with local_postgres_or_skip() as server:
        store = create_database(server.dsn, "test")
        stored_fleet(store)
        reader = StoreReader(store)

        async def ask() -> tuple[int, int, dict, int]:
            async with AsgiServer(read_api(reader, frozenset({TOKEN})), "the read API") as api:
                async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"},
                                             timeout=60) as client:
                    before = (await client.get("/api/v1/sessions")).status_code
                    server.stop()
                    gone = await client.get("/api/v1/sessions")
                    return before, gone.status_code, gone.json(), (await client.get("/healthz")).status_code

        try:
            before, status, body, health = asyncio.run(ask())
        finally:
            reader.close()
    assert (before, status, health) == (200, 503, 200)
    assert "the view store did not answer" in body["error"] and "postgresql://" in body["error"]
