"""A gateway's attested requests beside the steps of their session.

A gateway attests each exchange it forwarded on the session's key of the
events topic (:mod:`producers.gateway`); the projector keeps, of each, what
a reader shows beside a step (:func:`request_row`, the store's
``gateway_requests`` rows): which gateway and its arrival number, the
request's kind, status and outcome, when the gateway received it (its
wall clock, ms) and the upstream's timings (``firstByteMs``,
``durationMs``: the gateway's monotonic clock from forwarding it). Whether
the request is the one the log says was sent is the auditor's question
(digests, ``dsh.findings``), not this module's.

A page places each agent request at the step of its session whose time
span (the log's ``startedAt`` to ``endedAt``) holds the time the gateway
received it, the latest such step first (:func:`placed`): a placement by
the two clocks, exact only as far as the gateway's and the agent's host
clocks agree. A request no step of the page holds is not shown on it.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Sequence

from dsh_core.errors import DshError
from dsh_core.jsonvalue import MAX_SAFE_INTEGER, decode_json, thaw

__all__ = ["REQUEST_COLUMNS", "RequestRow", "placed", "request_row", "requests_during"]

#: A stored request's columns after the session id.
REQUEST_COLUMNS = ("gateway", "arrival", "kind", "status", "outcome", "received_at", "first_byte_ms", "duration_ms")
#: The gateway requests a page of a session reads at most.
REQUESTS_PER_PAGE = 2000
#: The characters of a gateway's name, kind or outcome kept (an attestation is the gateway's, but read as data).
_TEXT = 200

RequestRow = tuple[str, int, str, int | None, str, int | None, int | None, int | None]


def _number(value: Any) -> int | None:
    """A non-negative number as a whole number of a stored column, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SAFE_INTEGER:
        return None
    return round(value)


def request_row(arrival: int, value: bytes) -> RequestRow | None:
    """The stored row of an attestation record (its ``dsh-seq`` is the
    gateway's arrival number); ``None`` for a value that is no attestation."""
    try:
        body = thaw(decode_json(value))
    except DshError:  # not lossless JSON: no attestation to show (the auditor names what is wrong with it)
        return None
    if not isinstance(body, dict) or not isinstance(body.get("gateway"), str):
        return None
    upstream: dict[str, Any] = body["upstream"] if isinstance(body.get("upstream"), dict) else {}
    return (body["gateway"][:_TEXT], arrival, str(body.get("kind"))[:_TEXT], _number(body.get("status")),
            str(body.get("outcome"))[:_TEXT], _number(body.get("receivedAt")), _number(upstream.get("firstByteMs")),
            _number(upstream.get("durationMs")))


def placed(steps: list[dict[str, Any]], requests: list[tuple]) -> list[dict[str, Any]]:
    """``steps`` (a page's, :func:`~.session_pages.step_of`) each with
    ``gateway``: the agent requests (stored rows, :data:`REQUEST_COLUMNS`)
    received within its time span, in the order received."""
    timed = sorted((step["startedAt"], index) for index, step in enumerate(steps)
                   if step["startedAt"] is not None and step["endedAt"] is not None)
    starts = [start for start, _ in timed]
    found: list[list[dict[str, Any]]] = [[] for _ in steps]
    for gateway, arrival, kind, status, outcome, received, first_byte, duration in sorted(
            requests, key=lambda row: (row[5] is None, row[5] or 0, row[0], row[1])):
        if kind != "agent" or received is None:
            continue
        at = bisect.bisect_right(starts, received) - 1
        while at >= 0 and steps[timed[at][1]]["endedAt"] < received:
            at -= 1  # an earlier step may still run (a later one started and ended inside it)
        if at >= 0:
            found[timed[at][1]].append({"gateway": gateway, "arrival": arrival, "status": status, "outcome": outcome,
                                        "receivedAt": received, "upstreamFirstByteMs": first_byte,
                                        "upstreamMs": duration})
    return [step | {"gateway": requests_of} for step, requests_of in zip(steps, found)]


def requests_during(rows: Callable[[str, Sequence[Any]], list[tuple]], session_id: str,
                    steps: list[dict[str, Any]]) -> list[tuple]:
    """The stored requests of a session (``rows``: a store's query) received
    from the first of these steps' starts to the last of their ends, at most
    :data:`REQUESTS_PER_PAGE`."""
    starts = [step["startedAt"] for step in steps if step["startedAt"] is not None]
    ends = [step["endedAt"] for step in steps if step["endedAt"] is not None]
    if not starts or not ends:
        return []
    return rows(f"SELECT {', '.join(REQUEST_COLUMNS)} FROM gateway_requests WHERE session_id = ? AND received_at >= ? "
                "AND received_at <= ? ORDER BY received_at LIMIT ?", (session_id, min(starts), max(ends),
                                                                      REQUESTS_PER_PAGE))
