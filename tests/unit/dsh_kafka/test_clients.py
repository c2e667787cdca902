"""The client factories' repairs of aiokafka behaviour, against the pinned
aiokafka's own code with a stand-in network."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka.client import CoordinationType
from aiokafka.errors import KafkaConnectionError

from dsh_kafka.clients import make_producer
from dsh_kafka.config import KafkaConfig


def test_a_transactional_sender_retries_a_coordinator_lookup_whose_connection_closed():
    # Unretried, the lookup's KafkaConnectionError ended the sender: the producer could commit nothing more.
    async def run() -> tuple[int, list[object]]:
        producer = make_producer(KafkaConfig("127.0.0.1:9"), transactional_id="auditor.events.0")
        answers: list[object] = [KafkaConnectionError("Connection at 127.0.0.1:9 closed"),
                                 SimpleNamespace(error_code=0, coordinator_id=2)]

        async def send(node_id: int, request: object, **_: object) -> object:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        async def ready(node_id: int, **_: object) -> bool:
            return True

        refreshed = asyncio.get_running_loop().create_future()
        refreshed.set_result(True)
        client = producer.client
        client.send, client.ready, client.get_random_node = send, ready, lambda: 1
        client.force_metadata_update = lambda: refreshed
        try:
            found = await producer._sender._find_coordinator(CoordinationType.TRANSACTION, "auditor.events.0")
        finally:
            await producer.stop()
        return found, answers

    assert asyncio.run(run()) == (2, [])
