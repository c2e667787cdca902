"""A simulated fleet run at once: every session of a :class:`SimulatorConfig`,
concurrently, and the ground-truth manifest of what it sent."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any, Callable

from dsh_kafka.records import SessionRecord

from .simulator import FAULT_KINDS, SimulatedSession, SimulatorConfig, fault_assignment, simulate_session

__all__ = ["fleet", "formats_summary", "manifest"]


async def fleet(config: SimulatorConfig, send: Callable[[SessionRecord], Any], concurrency: int = 64,
                on_batch: Callable[[int], None] | None = None) -> list[SimulatedSession]:
    """Run the whole fleet concurrently; ``send`` is awaited per record
    (e.g. :meth:`Publisher.send`). Returns every session's ground truth."""
    assignment = fault_assignment(config)
    truths: list[SimulatedSession] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(config.sessions):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            truth, batches = simulate_session(config, index, list(assignment.get(index, [])))
            truths.append(truth)
            for batch in batches:
                for record in batch:
                    await send(record)
                if on_batch is not None:
                    on_batch(sum(r.count for r in batch))
                await asyncio.sleep(0)  # let the other agents interleave

    await asyncio.gather(*(worker() for _ in range(min(concurrency, config.sessions))))
    truths.sort(key=lambda t: t.session_id)
    return truths


def manifest(config: SimulatorConfig, truths: list[SimulatedSession]) -> dict[str, Any]:
    """The ground-truth manifest the consumers' tests and the demo check."""
    counts = {kind: sum(1 for t in truths for d in t.defects if d.kind == kind) for kind in FAULT_KINDS}
    formats = {str(version): sum(1 for t in truths if t.format == version) for version in sorted(set(config.formats))}
    return {"seed": config.seed, "sessions": len(truths), "formats": formats, "faults": asdict(config.faults),
            "injected": counts,
            "events": sum(t.next_seq for t in truths), "attestations": sum(t.attestations for t in truths),
            "truth": {t.session_id: t.to_json() for t in truths}}


def formats_summary(manifest: dict[str, Any]) -> str:
    """How many sessions of each format a manifest holds: ``100 v0, 100 v3, 100 v4``."""
    return ", ".join(f"{count} v{version}" for version, count in sorted(manifest["formats"].items()))
