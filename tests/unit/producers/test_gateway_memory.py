"""The gateway's body memory is shared: no client of the fleet holds all of
it, and a client past half of it takes more only while a quarter is free."""

from __future__ import annotations

from producers.gateway_admission import BodyMemory


def test_one_client_never_takes_the_last_quarter():
    memory = BodyMemory(100)
    assert memory.take("a", 50) and memory.take("a", 25)  # past half, a quarter still free
    assert not memory.take("a", 1)
    assert memory.take("b", 25) and memory.held == 100
    assert not memory.take("b", 1)  # the whole memory is held


def test_a_client_within_half_takes_what_is_free():
    memory = BodyMemory(100)
    assert memory.take("a", 40) and memory.take("b", 50)
    assert memory.take("c", 10) and not memory.take("c", 1)


def test_given_back_bytes_are_the_clients_again():
    memory = BodyMemory(100)
    assert memory.take("a", 75)
    memory.give("a", 75)
    assert memory.held == 0 and memory.take("a", 75)
    memory.give("a", 30)
    assert memory.take("a", 30) and not memory.take("a", 1)
