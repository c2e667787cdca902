"""A partition handed over and back: the scenario every stateful consumer
must survive. One member consumes alone, a second takes some partitions and
carries their sessions on, then leaves; the first takes them back and must
continue from the shared state, not from what it knew before."""

from __future__ import annotations

import asyncio
from typing import Callable

from producers.publisher import Publisher
from producers.simulator import SimulatorConfig, SimulatedSession, simulate_session
from tests.kafka_fixtures import end_offsets


def in_thirds(config: SimulatorConfig) -> tuple[list[SimulatedSession], tuple[list, list, list]]:
    """The fleet's ground truth and its records cut in three, each session's
    records in order across the thirds."""
    truths, thirds = [], ([], [], [])
    for index in range(config.sessions):
        truth, batches = simulate_session(config, index)
        records = [r for batch in batches for r in batch]
        truths.append(truth)
        for part in range(3):
            thirds[part].extend(records[len(records) * part // 3: len(records) * (part + 1) // 3])
    return truths, thirds


async def hand_over(kafka, names, make_member: Callable, config: SimulatorConfig,
                    timeout: float = 120) -> list[SimulatedSession]:
    """Publish a third of the fleet, let the members catch up, change the
    group, repeat; returns the fleet's ground truth."""
    truths, thirds = in_thirds(config)
    first, second = make_member(), make_member()
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(first.run(stop_first))]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def until(condition, what: str) -> None:
        while not condition():
            assert loop.time() < deadline and not any(t.done() for t in tasks), f"timed out waiting for {what}"
            await asyncio.sleep(0.01)  # wait-ok: polling a condition with a deadline

    async def publish_and_wait(records, members) -> None:
        async with Publisher(kafka, names) as publisher:
            await publisher.send_many(records)
            await publisher.flush()
        ends = await end_offsets(kafka, names.events)

        def done() -> bool:
            consumed = {tp.partition: offset for member in members for tp, offset in member.positions().items()
                        if tp in member.assignment()}
            return all(consumed.get(p, 0) >= end for p, end in ends.items() if end)
        await until(done, "the members to catch up")

    partitions = len(await end_offsets(kafka, names.events))
    await until(lambda: first.assignment(), "the first member's partitions")
    await publish_and_wait(thirds[0], [first])
    tasks.append(asyncio.create_task(second.run(stop_second)))
    await until(lambda: second.assignment() and len(first.assignment()) + len(second.assignment()) == partitions,
                "the rebalance")
    await publish_and_wait(thirds[1], [first, second])
    stop_second.set()
    await tasks.pop()
    await until(lambda: len(first.assignment()) == partitions, "the partitions to come back")
    await publish_and_wait(thirds[2], [first])
    stop_first.set()
    await tasks.pop()
    return truths
