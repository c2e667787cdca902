"""A fleet run stopped part way: its manifest holds the sessions sent whole,
names those cut short and says it is partial."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from producers.fleet import fleet, manifest
from producers.simulator import SimulatorConfig, simulate_session

CONFIG = SimulatorConfig(sessions=40, seed=3, max_turns=3)


def test_a_stopped_run_has_the_truth_of_what_was_sent_whole_and_names_what_was_cut_short():
    sent: dict[str, list[int]] = defaultdict(list)
    stop = asyncio.Event()

    async def send(record) -> None:
        sent[record.session_id].append(record.seq)
        if sum(map(len, sent.values())) == 500:
            stop.set()

    run = asyncio.run(fleet(CONFIG, send, concurrency=8, stop=stop))
    assert run.stopped and sum(map(len, sent.values())) == 500  # nothing sent after the stop
    whole = {truth.session_id for truth in run.truths}
    assert whole and run.unfinished and whole.isdisjoint(run.unfinished)
    assert set(sent) == whole | set(run.unfinished)
    for index in range(CONFIG.sessions):
        truth, batches = simulate_session(CONFIG, index)
        everything = [record.seq for batch in batches for record in batch]
        if truth.session_id in whole:
            assert sent[truth.session_id] == everything
        elif truth.session_id in run.unfinished:
            assert 0 < len(sent[truth.session_id]) < len(everything)
            assert sent[truth.session_id] == everything[:len(sent[truth.session_id])]
    partial = manifest(CONFIG, run.truths, partial=run.stopped, unfinished=run.unfinished)
    assert (partial["partial"], partial["unfinished"], set(partial["truth"])) == (True, run.unfinished, whole)
    assert partial["sessions"] == len(whole) < CONFIG.sessions


def test_a_run_not_stopped_sends_every_session_whole():
    async def send(record) -> None:
        pass

    run = asyncio.run(fleet(CONFIG, send, stop=asyncio.Event()))
    assert (run.stopped, run.unfinished, len(run.truths)) == (False, [], CONFIG.sessions)
    assert manifest(CONFIG, run.truths)["partial"] is False
