"""Granting ACLs on a test broker (aiokafka has no ACL admin call: this
sends the CreateAcls request itself, over the broker's superuser listener)."""

from __future__ import annotations

from aiokafka.protocol.admin import CreateAclsRequest

from dsh_kafka.acls import Acl
from dsh_kafka.clients import make_admin
from dsh_kafka.config import KafkaConfig

_RESOURCE = {"topic": 2, "group": 3, "transactional-id": 5}
_OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8, "DescribeConfigs": 10}
_PREFIXED, _ALLOW = 4, 3


async def grant(superuser: KafkaConfig, acls: list[Acl]) -> None:
    admin = make_admin(superuser)
    await admin.start()
    try:
        node = next(iter(admin._client.cluster.brokers())).nodeId
        for acl in acls:  # one ACL per request: aiokafka's request takes one
            response = await admin._client.send(node, CreateAclsRequest(
                _RESOURCE[acl.resource], acl.prefix, _PREFIXED, acl.principal, "*", _OPERATION[acl.operation],
                _ALLOW))
            assert all(result[0] == 0 for result in response.creation_responses), (acl, response)
    finally:
        await admin.close()
