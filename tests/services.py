"""The three consumer services as tests build them: one group each, the
rest of each configuration at its defaults unless a test says otherwise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from consumers.archiver import ArchiverConfig, archiver_service
from consumers.auditor import AuditorConfig, auditor_service
from consumers.projector import ProjectorConfig, projector_service
from consumers.runtime import ConsumerService


def projector(kafka, names, group: str, store: Path, **options) -> ConsumerService:
    return projector_service(ProjectorConfig(kafka=kafka, topics=names, group=group, store=store, **options))


def auditor(kafka, names, group: str, **options) -> ConsumerService:
    return auditor_service(AuditorConfig(kafka=kafka, topics=names, group=group, **options))


def archiver(kafka, names, group: str, root: Path, **options) -> ConsumerService:
    return archiver_service(ArchiverConfig(kafka=kafka, topics=names, group=group, root=root, **options))


def wire_verdicts() -> Counter:
    """The auditor's gateway verdicts so far in this process, by (wire, kind,
    verdict): subtract the counts taken before a scenario."""
    from prometheus_client import REGISTRY
    counts = Counter()
    for metric in REGISTRY.collect():
        if metric.name == "dsh_audit_wire_requests":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    labels = sample.labels
                    counts[(labels["wire"], labels["kind"], labels["verdict"])] = int(sample.value)
    return counts
