"""Past the delivery deadline the shipper keeps a checkpoint of what the
cluster acknowledged and nothing more, so a restart ships no repeat, and a
fleet run keeps the truth of the sessions acknowledged whole (no broker:
each send returns a delivery the test resolves or leaves pending)."""

from __future__ import annotations

import asyncio

import pytest

from dsh_kafka.errors import DeliveryTimeoutError
from producers.fleet import fleet
from producers.publisher import acknowledged
from producers.shipper import Shipper, ShipperConfig
from producers.simulator import SimulatorConfig, simulate_session
from tests.unit.producers.test_shipper_checkpoints import HERE, Collected, events, write_session

DEADLINE = DeliveryTimeoutError("3 records were not acknowledged within the 8 s delivery deadline")


class Partly:
    """Sends whose deliveries are acknowledged while ``acknowledges(record)``,
    else left pending; the flush passes the deadline."""

    def __init__(self, acknowledges) -> None:
        self.acknowledges = acknowledges
        self.sent: list = []

    async def send(self, record) -> asyncio.Future:
        delivery = asyncio.get_running_loop().create_future()
        if self.acknowledges(record):
            delivery.set_result(None)
        self.sent.append(record)
        return delivery

    async def flush(self) -> None:
        raise DEADLINE


def test_the_checkpoint_keeps_what_was_acknowledged_and_a_restart_ships_only_the_rest(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    write_session(root, "s-1", count=5)
    write_session(root, "s-2", count=4)
    partly = Partly(lambda record: record.session_id == "s-1" or record.seq < 1)  # s-2: its header and seq 0

    async def first_pass() -> None:
        shipper = Shipper(ShipperConfig(root, state, once=True), partly.send, partly.flush, print, say=print,
                          destination=HERE)
        await shipper.ship_once()
    with pytest.raises(DeliveryTimeoutError) as raised:
        asyncio.run(first_pass())
    assert raised.value is DEADLINE
    assert sorted(r.seq for r in partly.sent if r.kind == "record") == [0, 0, 1, 1, 2, 2, 3, 3, 4]

    again = Collected()
    asyncio.run(Shipper(ShipperConfig(root, state, once=True), again.send, again.flush, again.lines.append,
                        say=again.lines.append, destination=HERE).ship_once())
    assert (again.seqs("s-1"), again.seqs("s-2")) == ([], [1, 2, 3])
    assert [r.kind for r in again.sent if r.session_id == "s-2"] == ["record"] * 3  # not its header again


def test_nothing_acknowledged_keeps_the_checkpoint_as_it_was(tmp_path):
    root, state = tmp_path / "root", tmp_path / "state"
    write_session(root, "s-1", count=3)
    shipped = Collected()
    asyncio.run(Shipper(ShipperConfig(root, state, once=True), shipped.send, shipped.flush, print, say=print,
                        destination=HERE).ship_once())
    with open(next(root.rglob("session.jsonl")), "ab") as log:
        log.write(events(3, 2))
    nothing = Partly(lambda record: False)
    with pytest.raises(DeliveryTimeoutError):
        asyncio.run(Shipper(ShipperConfig(root, state, once=True), nothing.send, nothing.flush, print, say=print,
                            destination=HERE).ship_once())
    again = Collected()
    asyncio.run(Shipper(ShipperConfig(root, state, once=True), again.send, again.flush, print, say=print,
                        destination=HERE).ship_once())
    assert again.seqs("s-1") == [3, 4]


def test_a_fleet_stopped_by_the_deadline_keeps_the_truth_of_the_sessions_acknowledged_whole():
    config = SimulatorConfig(sessions=6, seed=3, max_turns=2)
    budget = {"left": 40}

    async def run():
        loop = asyncio.get_running_loop()

        async def send(record) -> asyncio.Future:
            if budget["left"] == 0:
                raise DEADLINE
            budget["left"] -= 1
            delivery = loop.create_future()
            if record.session_id != sessions[0]:  # the first session's records are never acknowledged
                delivery.set_result(None)
            return delivery
        return await fleet(config, send, concurrency=1)

    sessions = [simulate_session(config, 0)[0].session_id]
    done = asyncio.run(run())
    assert done.failure is DEADLINE and done.stopped
    kept = done.acknowledged_only(acknowledged)
    assert kept.failure is DEADLINE and kept.stopped
    assert sessions[0] not in {truth.session_id for truth in kept.truths} and sessions[0] in kept.unfinished
    assert {truth.session_id for truth in kept.truths} == {truth.session_id for truth in done.truths} - {sessions[0]}
    assert kept.truths and len(done.unfinished) == 1  # the one cut short by the deadline
