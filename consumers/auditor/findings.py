"""What the auditor reports: findings, each session's verdict counts, and
the lossless-JSON check."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dsh_core.errors import Category, DecodeError
from dsh_core.json_depth import check_depth
from dsh_core.jsonvalue import MAX_SAFE_INTEGER, encode_json

__all__ = ["Finding", "Report", "category_of", "lossless_problem"]

# The error category of each rule that is not an invariant or a request
# check (the corpus's categories where they apply), so findings and dead
# letters can be matched to a refusal class.
_CATEGORY: dict[str, Category] = {
    "sequence-gap": "corrupt-storage", "corrupt-storage": "corrupt-storage",
    "unsupported-format": "unsupported-format", "invalid-log": "invalid-log", "lossless": "invalid-log",
    "internal": "internal", "conflicting-writer": "conflicting-writer"}


def category_of(rule: str) -> Category:
    return _CATEGORY.get(rule, "invariant" if rule.startswith("invariant:") else "reconstruction")


@dataclass(frozen=True)
class Finding:
    rule: str
    session: str
    seq: Any
    detail: str
    turn: Any = None
    step: Any = None
    severity: str = "error"

    def to_json(self) -> bytes:
        return encode_json({"rule": self.rule, "category": category_of(self.rule), "severity": self.severity,
                            "session": self.session, "seq": self.seq, "turn": self.turn, "step": self.step,
                            "detail": self.detail})


@dataclass
class Report:
    """What auditing one session's records found since it was last taken:
    findings, request verdicts and the number of events audited; and the
    session's verdict counts so far (``totals``: ``attested/<verdict>`` for
    worker attestations, ``wire/<kind>/<verdict>`` for a gateway's), with
    whether they changed since last taken."""

    session_id: str
    findings: list[Finding] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    wire_verdicts: list[tuple[str, str, str]] = field(default_factory=list)  # (wire, kind, verdict)
    events: int = 0
    totals: Counter[str] = field(default_factory=Counter)
    totals_changed: bool = False

    def finding(self, rule: str, seq: Any, detail: str, turn: Any = None, step: Any = None) -> None:
        self.findings.append(Finding(rule, self.session_id, seq, detail, turn, step))

    def verdict(self, verdict: str) -> None:
        """The verdict on a worker's attestation."""
        self.verdicts.append(verdict)
        self.totals[f"attested/{verdict}"] += 1
        self.totals_changed = True

    def wire_verdict(self, wire: str, kind: str, verdict: str) -> None:
        """The verdict on a request a gateway attested."""
        self.wire_verdicts.append((wire, kind, verdict))
        self.totals[f"wire/{kind}/{verdict}"] += 1
        self.totals_changed = True

    def counts_json(self) -> bytes:
        """The ``dsh.audit-verdicts`` value: ``{"session", "attested":
        {verdict: n}, "wire": {kind: {verdict: n}}}``."""
        attested: dict[str, int] = {}
        wire: dict[str, dict[str, int]] = {}
        for name, count in sorted(self.totals.items()):
            source, *rest = name.split("/")
            if source == "attested":
                attested[rest[0]] = count
            else:
                wire.setdefault(rest[0], {})[rest[1]] = count
        return encode_json({"session": self.session_id, "attested": attested, "wire": wire})

    def clear(self) -> None:
        self.findings.clear()
        self.verdicts.clear()
        self.wire_verdicts.clear()
        self.events = 0
        self.totals_changed = False


# Pre-filter, a C-speed scan of the whole value (a per-byte regex costs more
# than the fold): digits become '0', '-' stays, a byte that can end a number
# token ('.', 'e', 'E', ',', ']', '}', whitespace) a space, any other 'x'; then
# a "-0" before a space or at the end (a possible negative zero) or a run of
# 16 digits (an integer that may exceed 2^53) sends the value to the exact check.
_NUMBER_SKELETON = bytes(0x30 if 0x30 <= byte <= 0x39 else byte if byte == 0x2D else
                         0x20 if byte in b".eE,]} \t\r\n" else 0x78 for byte in range(256))
_SIXTEEN_DIGITS = b"0" * 16


def lossless_problem(value: bytes) -> str | None:
    """What in a record's JSON would not survive a round trip, if anything."""
    skeleton = value.translate(_NUMBER_SKELETON)
    if b"-0 " not in skeleton and not skeleton.endswith(b"-0") and _SIXTEEN_DIGITS not in skeleton:
        return None
    found: list[str] = []

    def number(text: str) -> Any:
        if text.lstrip("-").isdigit():
            parsed = int(text)
            if parsed == 0 and text.startswith("-"):
                found.append(f"negative zero {text}")
            elif abs(parsed) > MAX_SAFE_INTEGER:
                found.append(f"integer {text} is outside ±(2^53-1)")
            return parsed
        parsed_float = float(text)
        if parsed_float == 0 and text.startswith("-"):
            found.append(f"negative zero {text}")
        return parsed_float

    try:
        check_depth(value)
        json.loads(value, parse_int=number, parse_float=number)
    except (ValueError, DecodeError):
        return None  # not JSON at all: the fold refuses it with a better reason
    return "; ".join(found) or None
