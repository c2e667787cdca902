"""A broker outage, as the services log it: the projector, auditor, archiver
and shipper, run as the CLI runs them with ``--log-format json``, through a
20 s outage of their one broker (longer while it starts again). Every line
is one JSON object; the Kafka client's retries (hundreds a second) show as
one line per cause and interval, and their count as a line with ``count``
when the interval ends or the service stops.
(``python -m benchmarks.outage_logs`` measures longer outages.)"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from benchmarks.outage_logs import SERVICES, measure
from dsh_pipeline.log_lines import REPEAT_INTERVAL

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

OUTAGE = 20.0


def test_a_broker_outage_gives_one_json_line_per_client_error_cause_and_its_count():
    measured = measure(Path(__file__).resolve().parents[3], OUTAGE, 10.0, "json")
    lines = {name: [json.loads(line) for line in measured.during[name] + measured.after[name]]
             for name in SERVICES}  # raises on a line that is not JSON
    assert all(isinstance(line, dict) and line["service"] == name for name in SERVICES for line in lines[name])
    # the outage lasts until the broker serves again: on a loaded host its start takes longer than OUTAGE
    intervals = 1 + int(measured.seconds // REPEAT_INTERVAL)
    for name in SERVICES:
        during = [json.loads(line) for line in measured.during[name]]
        client = [line for line in during if line["logger"].startswith("aiokafka")]
        causes = collections.Counter((line["logger"], line["level"], _REPEATED.sub("", line["message"]))
                                     for line in client)
        print(f"\noutage logs: {name}: {len(during)} lines in {measured.seconds:.0f} s of outage "
              f"({len(client)} of the client, {len(causes)} causes), {len(measured.after[name])} after")
        assert len(causes) <= 12 and max(causes.values(), default=0) <= 1 + intervals, causes
    counted = [line for name in ("project", "audit", "archive") for line in lines[name] if "count" in line]
    assert counted and max(line["count"] for line in counted) >= 10, counted  # retries were many, and counted
    assert all(_REPEATED.search(line["message"]) for line in counted), counted


_REPEATED = re.compile(r" \(repeated \d+ times in the last \d+ s\)$")
