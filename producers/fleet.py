"""A simulated fleet run at once: every session of a :class:`SimulatorConfig`,
concurrently, and the ground-truth manifest of what it sent."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from dsh_kafka.records import SessionRecord

from .simulator import FAULT_KINDS, SimulatedSession, SimulatorConfig, fault_assignment, simulate_session

__all__ = ["FleetRun", "fleet", "formats_summary", "manifest"]


@dataclass(frozen=True)
class FleetRun:
    """What a fleet run sent: the ground truth of each session sent whole;
    whether a stop ended the run early, and the sessions it cut short
    (some of their records sent)."""

    truths: list[SimulatedSession]
    stopped: bool = False
    unfinished: list[str] = field(default_factory=list)


async def fleet(config: SimulatorConfig, send: Callable[[SessionRecord], Any], concurrency: int = 64,
                on_batch: Callable[[int], None] | None = None, stop: asyncio.Event | None = None) -> FleetRun:
    """Run the whole fleet concurrently; ``send`` is awaited per record
    (e.g. :meth:`Publisher.send`). Once ``stop`` is set no record more is
    sent: the run has the truths of the sessions sent whole by then."""
    assignment = fault_assignment(config)
    truths: list[SimulatedSession] = []
    unfinished: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(config.sessions):
        queue.put_nowait(index)

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    async def worker() -> None:
        while not queue.empty() and not stopped():
            index = queue.get_nowait()
            truth, batches = simulate_session(config, index, list(assignment.get(index, [])))
            sent = 0
            for batch in batches:
                for record in batch:
                    if stopped():
                        if sent:
                            unfinished.append(truth.session_id)
                        return
                    await send(record)
                    sent += 1
                if on_batch is not None:
                    on_batch(sum(r.count for r in batch))
                await asyncio.sleep(0)  # let the other agents interleave
            truths.append(truth)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, config.sessions))))
    truths.sort(key=lambda t: t.session_id)
    return FleetRun(truths, stopped(), sorted(unfinished))


def manifest(config: SimulatorConfig, truths: list[SimulatedSession], *, partial: bool = False,
             unfinished: Sequence[str] = ()) -> dict[str, Any]:
    """The ground-truth manifest the consumers' tests and the demo check;
    ``partial`` for a run stopped early: ``truth`` holds the sessions sent
    whole, ``unfinished`` those of which only some records were sent."""
    counts = {kind: sum(1 for t in truths for d in t.defects if d.kind == kind) for kind in FAULT_KINDS}
    formats = {str(version): sum(1 for t in truths if t.format == version) for version in sorted(set(config.formats))}
    return {"seed": config.seed, "sessions": len(truths), "formats": formats, "faults": asdict(config.faults),
            "injected": counts,
            "events": sum(t.next_seq for t in truths), "attestations": sum(t.attestations for t in truths),
            "partial": partial, "unfinished": list(unfinished),
            "truth": {t.session_id: t.to_json() for t in truths}}


def formats_summary(manifest: dict[str, Any]) -> str:
    """How many sessions of each format a manifest holds: ``100 v0, 100 v3, 100 v4``."""
    return ", ".join(f"{count} v{version}" for version, count in sorted(manifest["formats"].items()))
