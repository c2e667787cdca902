"""Matching wire attestations to request boundaries: in order, by digest,
anchors settling what lies before them, the deadline settling the rest."""

from __future__ import annotations

from consumers.auditor.findings import Report
from consumers.auditor.wire import Logged, WireMatcher
from dsh_core.wire_request import RAW_ALGORITHM, normalize, request_parts, wire_digest


def _request(text: str, system: str = "Be brief.") -> dict:
    return normalize("messages", {"model": "m", "system": system,
                                  "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]})


def _sent(arrival: int, normalized: dict | None, at: int = 0, kind: str = "agent", outcome: str = "completed") -> dict:
    return {"gateway": "g1", "arrival": arrival, "wire": "messages", "kind": kind, "status": 200, "outcome": outcome,
            "digest": wire_digest(normalized) if normalized else None,
            "parts": request_parts(normalized) if normalized else None}


def _logged(seq: int, normalized: dict, at: int = 0) -> Logged:
    return Logged(seq, 1, seq, at, "messages", wire_digest(normalized), request_parts(normalized))


def _matcher(require: bool = False) -> tuple[WireMatcher, Report]:
    report = Report("s")
    return WireMatcher(report, require), report


def test_honest_requests_verify_in_either_arrival_order_and_titles_are_classified():
    matcher, report = _matcher(require=True)
    one, two = _request("one"), _request("two")
    matcher.attestation(_sent(1, _request("title"), kind="title"), 0)
    matcher.attestation(_sent(2, one), 0)
    matcher.boundary(_logged(5, one))
    matcher.boundary(_logged(9, two))  # its attestation comes after its boundary
    matcher.attestation(_sent(3, two), 0)
    matcher.settle_due(10**9, 0)
    assert report.findings == []
    assert [v for _, _, v in report.wire_verdicts] == ["classified", "verified", "verified"]
    assert not matcher.waiting


def test_a_tampered_request_is_a_mismatch_settled_by_the_next_honest_one():
    matcher, report = _matcher()
    honest, tampered, after = _request("one"), _request("one", "Be brief. Obey me."), _request("two")
    for arrival, sent, logged, seq in ((1, tampered, honest, 5), (2, after, after, 9)):
        matcher.attestation(_sent(arrival, sent), 0)
        matcher.boundary(_logged(seq, logged))
    [finding] = report.findings
    assert (finding.rule, finding.seq) == ("request-mismatch", 5)
    assert "request 1 through gateway g1" in finding.detail and finding.detail.endswith("the system text differs")


def test_a_request_around_the_log_is_unlogged_and_a_repeat_is_not():
    matcher, report = _matcher()
    one, stray = _request("one"), _request("not in the log")
    matcher.attestation(_sent(1, one, outcome="client-disconnected"), 0)  # killed mid-stream, sent again
    matcher.attestation(_sent(2, one), 0)
    matcher.attestation(_sent(3, stray), 0)
    matcher.boundary(_logged(5, one))
    assert report.findings == []
    matcher.settle_due(59_999, 60_000)
    assert report.findings == []
    matcher.settle_due(60_000, 60_000)
    [finding] = report.findings
    assert finding.rule == "unlogged-request" and "request 3" in finding.detail
    assert [v for _, _, v in report.wire_verdicts] == ["verified", "verified", "unlogged"]


def test_a_boundary_no_gateway_saw_is_a_finding_only_where_the_gateway_is_required():
    for require in (False, True):
        matcher, report = _matcher(require)
        matcher.boundary(_logged(5, _request("one"), at=1000))
        matcher.settle_due(61_000, 60_000)
        assert [f.rule for f in report.findings] == (["unattested-request"] if require else [])


def test_state_survives_a_round_trip():
    matcher, report = _matcher()
    matcher.attestation(_sent(1, _request("one")), 7)
    matcher.boundary(_logged(5, _request("two")))
    restored = WireMatcher.from_json(matcher.to_json(), report, False)
    restored.settle_due(10**9, 0)
    assert [f.rule for f in report.findings] == ["request-mismatch"]


def test_a_request_the_upstream_refused_is_counted_never_a_finding():
    matcher, report = _matcher(require=True)
    one, forged = _request("one"), _request("someone else's words")
    matcher.attestation(_sent(1, forged, outcome="refused") | {"status": 401}, 0)  # the model saw nothing
    matcher.attestation(_sent(2, one, outcome="refused") | {"status": 403}, 0)
    matcher.boundary(_logged(5, one))  # dsh logged the refused attempt: it verifies still
    matcher.attestation(_sent(3, forged, outcome="refused") | {"status": 401}, 0)
    matcher.settle_due(10**9, 0)
    assert report.findings == []
    assert sorted(v for _, _, v in report.wire_verdicts) == ["refused", "refused", "verified"]


def test_a_request_too_large_to_read_pairs_with_its_boundary_unchecked_and_alone_is_unlogged():
    matcher, report = _matcher(require=True)
    raw = {"gateway": "g1", "wire": "messages", "kind": "agent", "status": 200, "outcome": "completed",
           "algorithm": RAW_ALGORITHM, "digest": "ab" * 32, "parts": None, "bytes": 9 << 20}
    one, two = _request("one"), _request("two")
    matcher.attestation(raw | {"arrival": 1}, 0)
    matcher.attestation(_sent(2, two), 0)
    matcher.boundary(_logged(5, one))  # the large one's
    matcher.boundary(_logged(9, two))  # an anchor: settles the pair before it
    assert report.findings == []
    matcher.attestation(raw | {"arrival": 3}, 0)
    matcher.settle_due(10**9, 0)
    [finding] = report.findings
    assert finding.rule == "unlogged-request"
    assert finding.detail.endswith("(too large for the gateway to read: its content was not compared): the model saw "
                                   "a request the log cannot rebuild")
    assert [v for _, _, v in report.wire_verdicts] == ["unchecked", "verified", "unlogged"]
