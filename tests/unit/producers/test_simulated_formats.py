"""The simulator writes v0, v3 and v4 fleets with the same countable faults,
and the three services' policies (no broker) agree with its ground truth for
each format and for a mixed fleet, the check the demo makes."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.projector import Projection, ProjectorConfig
from dsh_core.formats import open_fold
from dsh_core.storage.layout import find_session_files, generation_of
from dsh_kafka.records import KIND_HEADER, KIND_RECORD
from dsh_pipeline.ground_truth import compare
from producers.fleet import manifest
from producers.simulator import FaultPlan, SimulatorConfig, simulate_session
from tests.policy_driver import KAFKA, NAMES, fetched, run_batch

FAULTS = FaultPlan(unlogged=2, dropped=2, duplicate=2, lossless=2, unknown=2)


def _fleet(config: SimulatorConfig):
    truths, records = [], []
    for index in range(config.sessions):
        truth, batches = simulate_session(config, index)
        records += [record for batch in batches for record in batch]
        truths.append(truth)
    return manifest(config, truths), records


@pytest.mark.parametrize("formats", [(3,), (4,), (0, 3, 4)], ids=["v3", "v4", "mixed"])
def test_every_service_agrees_with_the_simulator_s_truth(formats, tmp_path):
    config = SimulatorConfig(sessions=24, seed=5, formats=formats, faults=FAULTS)
    truth, records = _fleet(config)
    assert truth["injected"] == {kind: 2 for kind in ("unlogged", "dropped", "duplicate", "lossless", "unknown")}
    assert Counter(t["format"] for t in truth["truth"].values()) == Counter(
        formats[i % len(formats)] for i in range(config.sessions))
    views, archive = tmp_path / "views.sqlite", tmp_path / "archive"
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=views)), fetched(records))
    audit = run_batch(Audit(AuditorConfig(kafka=KAFKA, state=tmp_path / "audit.sqlite")), fetched(records))
    run_batch(Archive(ArchiverConfig(kafka=KAFKA, root=archive)), fetched(records))
    findings = [json.loads(value) for _, value, _ in audit.on(NAMES.findings)]
    assert compare(truth, views, archive, findings) == []
    archived = {path.parent.name: generation_of(path) for path in find_session_files(archive)}
    assert archived == {sid: t["format"] for sid, t in truth["truth"].items()}


@pytest.mark.parametrize("version", [3, 4])
def test_a_clean_simulated_session_is_a_whole_log_its_format_accepts(version):
    """Ended, not just unrefused so far: every lifecycle the log opened is closed."""
    config = SimulatorConfig(sessions=30, seed=8, formats=(version,))
    for index in range(config.sessions):
        truth, batches = simulate_session(config, index)
        records = [r for batch in batches for r in batch]
        [header] = [r for r in records if r.kind == KIND_HEADER]
        fold = open_fold(header.value, truth.session_id)
        for record in records:
            if record.kind == KIND_RECORD:
                fold.apply(record.value)
        fold.finish()
        assert (fold.error, fold.idle, fold.count, header.format_version) == (None, True, truth.next_seq, version)


def test_a_format_the_simulator_cannot_write_is_refused_by_name():
    with pytest.raises(ValueError, match="simulated formats must be some of 0, 3, 4, got 2"):
        SimulatorConfig(formats=(2,))
