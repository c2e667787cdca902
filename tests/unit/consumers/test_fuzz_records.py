"""Corpus logs mutated at the byte, JSON-type and line level (Hypothesis),
through the storage reader and through each service's record handling
without a broker. The only outcomes are a log accepted or refused by a
named error, and records applied, held, skipped as duplicates or
dead-lettered with a named reason other than ``internal``.

``DSH_FUZZ_EXAMPLES`` sets the examples per property (300 in the suite;
a nightly run takes 50000 for 100k inputs over the two properties)."""

from __future__ import annotations

import json
import os
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.projector import Projection, ProjectorConfig
from dsh_core.errors import Category, DecodeError, DshError
from dsh_core.loader import load_session_bytes
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord, record_from_line
from tests.conftest import corpus_logs, expected_of
from tests.policy_driver import KAFKA, NAMES, fetched, run_batch

EXAMPLES = int(os.environ.get("DSH_FUZZ_EXAMPLES", "300"))
_LOGS = [log.read_bytes().split(b"\n")[:-1] for log in corpus_logs("dsh-real")[::10]
         if expected_of(log)["accepted"] and log.stat().st_size < 200_000]
_ODD_VALUES = [None, True, 0, -1, 2**63, 1.5, -0.0, "", "\ud800", [], {}, [1, [2]], {"type": {}}, "x" * 300]
# Derandomized: CI runs the same inputs every time; more examples reach further.
_FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
#: A failing example is a whole log: its repr is long, and that is fine.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")


def _paths(value: typing.Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, path + (index,))
    return found


def _replace(value: typing.Any, path: tuple, new: typing.Any) -> typing.Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(copy[path[0]], path[1:], new)
    return copy


@st.composite
def mutated_logs(draw: st.DrawFn) -> list[bytes]:
    lines = list(draw(st.sampled_from(_LOGS)))
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["byte", "json", "drop", "repeat", "swap", "join"]))
        line = lines[index]
        if kind == "byte" and line:
            at = draw(st.integers(0, len(line) - 1))
            lines[index] = line[:at] + bytes([draw(st.integers(0, 255))]) + line[at + draw(st.integers(0, 1)):]
        elif kind == "json":
            try:
                value = json.loads(line)
            except ValueError:  # an earlier byte mutation broke it
                continue
            path = draw(st.sampled_from(_paths(value)))
            lines[index] = json.dumps(_replace(value, path, draw(st.sampled_from(_ODD_VALUES)))).encode()
        elif kind == "drop" and len(lines) > 1:
            del lines[index]
        elif kind == "repeat":
            lines.insert(index, line)
        elif kind == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], line
        elif kind == "join" and index + 1 < len(lines):
            lines[index:index + 2] = [line + lines[index + 1]]
    return lines


def _records(lines: list[bytes]) -> list[SessionRecord]:
    """The records a shipper would publish, a line that is no record kept
    as one event at the next seq (a hostile writer's)."""
    try:
        session_id = json.loads(lines[0])["id"]
    except (ValueError, KeyError, TypeError, IndexError):
        session_id = "fuzzed"
    try:  # a record key is bytes: an id that is not UTF-8 cannot be one
        session_id = session_id if isinstance(session_id, str) and session_id.encode() else "fuzzed"
    except UnicodeEncodeError:
        session_id = "fuzzed"
    records, next_seq = [SessionRecord(session_id, KIND_HEADER, 0, 0, lines[0])], 0
    for line in lines[1:]:
        try:
            record = record_from_line(session_id, line)
            if record.seq > 2**53 - 1 or record.count > 2**53 - 1:
                raise DecodeError("out of range")
        except DecodeError:
            record = SessionRecord(session_id, KIND_RECORD, next_seq, 1, line)
        next_seq = record.seq + record.count
        records.append(record)
    return records


@_FUZZ
@given(mutated_logs())
def test_the_reader_accepts_or_refuses_by_name(lines):
    result = load_session_bytes(b"\n".join(lines) + b"\n", "fuzzed", "none")
    assert result.error is None or isinstance(result.error, DshError)


_NAMED = set(typing.get_args(Category)) - {"internal"}


@_FUZZ
@given(mutated_logs())
def test_every_service_applies_holds_or_refuses_by_name(lines):
    records = fetched(_records(lines))
    with tempfile.TemporaryDirectory() as tmp:
        for policy in (Projection(ProjectorConfig(kafka=KAFKA, store=Path(tmp) / "views.sqlite")),
                       Audit(AuditorConfig(kafka=KAFKA)), Archive(ArchiverConfig(kafka=KAFKA, root=Path(tmp) / "a"))):
            outputs = run_batch(policy, records)
            reasons = {headers["dsh-dlq-reason"].decode() for _, _, headers in outputs.on(NAMES.dead_letter)}
            assert reasons <= _NAMED, (policy.name, [h["dsh-dlq-error"] for _, _, h in outputs.on(NAMES.dead_letter)])
