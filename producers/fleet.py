"""A simulated fleet run at once: every session of a :class:`SimulatorConfig`,
concurrently, and the ground-truth manifest of what it sent."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from dsh_kafka.errors import DeliveryTimeoutError
from dsh_kafka.records import SessionRecord

from .simulator import FAULT_KINDS, SimulatedSession, SimulatorConfig, fault_assignment, simulate_session

__all__ = ["FleetRun", "fleet", "formats_summary", "manifest"]


@dataclass(frozen=True)
class FleetRun:
    """What a fleet run sent: the ground truth of each session sent whole;
    whether a stop ended the run early, and the sessions it cut short
    (some of their records sent); what ``send`` returned for each whole
    session's last record (its delivery), and the delivery deadline that
    ended the run, if one did."""

    truths: list[SimulatedSession]
    stopped: bool = False
    unfinished: list[str] = field(default_factory=list)
    last_sent: dict[str, Any] = field(default_factory=dict)
    failure: DeliveryTimeoutError | None = None

    def acknowledged_only(self, acknowledged: Callable[[Any], bool]) -> "FleetRun":
        """The run as far as the cluster acknowledged it: a whole session
        whose last record was not acknowledged is unfinished."""
        whole = [truth for truth in self.truths if acknowledged(self.last_sent.get(truth.session_id))]
        cut = {truth.session_id for truth in self.truths} - {truth.session_id for truth in whole}
        return FleetRun(whole, True, sorted({*self.unfinished, *cut}),
                        {t.session_id: self.last_sent[t.session_id] for t in whole}, self.failure)


async def fleet(config: SimulatorConfig, send: Callable[[SessionRecord], Any], concurrency: int = 64,
                on_batch: Callable[[int], None] | None = None, stop: asyncio.Event | None = None) -> FleetRun:
    """Run the whole fleet concurrently; ``send`` is awaited per record
    (e.g. :meth:`Publisher.send`). Once ``stop`` is set no record more is
    sent: the run has the truths of the sessions sent whole by then. A
    send that passes the delivery deadline (:class:`DeliveryTimeoutError`)
    stops the run as ``stop`` does; the run holds the error."""
    assignment = fault_assignment(config)
    truths: list[SimulatedSession] = []
    unfinished: list[str] = []
    last_sent: dict[str, Any] = {}
    failures: list[DeliveryTimeoutError] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(config.sessions):
        queue.put_nowait(index)

    def stopped() -> bool:
        return bool(failures) or (stop is not None and stop.is_set())

    async def worker() -> None:
        while not queue.empty() and not stopped():
            index = queue.get_nowait()
            truth, batches = simulate_session(config, index, list(assignment.get(index, [])))
            sent, delivery = 0, None
            for batch in batches:
                for record in batch:
                    if stopped():
                        if sent:
                            unfinished.append(truth.session_id)
                        return
                    try:
                        delivery = await send(record)
                    except DeliveryTimeoutError as error:
                        failures.append(error)
                        unfinished.append(truth.session_id)
                        return
                    sent += 1
                if on_batch is not None:
                    on_batch(sum(r.count for r in batch))
                await asyncio.sleep(0)  # let the other agents interleave
            truths.append(truth)
            last_sent[truth.session_id] = delivery

    await asyncio.gather(*(worker() for _ in range(min(concurrency, config.sessions))))
    truths.sort(key=lambda t: t.session_id)
    return FleetRun(truths, stopped(), sorted(unfinished), last_sent, failures[0] if failures else None)


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
