"""The ACLs a principal running the pipeline needs on an authorizing cluster.

One list, from which ``dsh-pipeline acls`` prints the ``kafka-acls.sh``
commands an operator runs. Every pipeline topic, consumer group and
transactional id starts with a prefix the deployment chooses (``--topic-prefix``
before the topic names, ``dsh-`` before the groups, the auditor's group
before its transactional ids), so prefixed ACLs cover them.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.protocol.admin import CreateAclsRequest


from .clients import make_admin
from .config import KafkaConfig
from .errors import ClusterUnavailableError
from .topics import TopicNames

__all__ = ["Acl", "SERVICES", "grant", "kafka_acls_commands", "pipeline_acls", "service_acls"]


@dataclass(frozen=True)
class Acl:
    """Allow ``principal`` ``operation`` on the resources whose name starts
    with ``prefix`` (``resource``: ``topic``, ``group``, ``transactional-id``);
    a ``literal`` one, on the resource of exactly that name."""

    principal: str
    resource: str
    prefix: str
    operation: str
    pattern: str = "prefixed"  # or "literal"


def pipeline_acls(principal: str, names: TopicNames = TopicNames(), group_prefix: str = "dsh-") -> list[Acl]:
    """Everything ``principal`` needs; ``group_prefix`` must begin every
    ``--group`` the services run in (the defaults all begin with ``dsh-``).

    Topics: set up and checked (``Create``, ``Describe``,
    ``DescribeConfigs``), read and written (``Read``, ``Write``: with
    ``Write``, idempotent producers need no cluster ACL); groups: joined and
    committed (``Read``, ``Describe``); the auditor's transactional ids
    (its group, then ``.``): ``Write``, ``Describe``."""
    topics = names.events[:-len(TopicNames().events)] + "dsh."
    acls = [Acl(principal, "topic", topics, operation)
            for operation in ("Create", "Describe", "DescribeConfigs", "Read", "Write")]
    acls += [Acl(principal, "group", group_prefix, operation) for operation in ("Read", "Describe")]
    acls += [Acl(principal, "transactional-id", group_prefix, operation) for operation in ("Write", "Describe")]
    return acls


#: What each service reads besides the events topic: the projector indexes
#: findings, dead letters and verdict counts into its store (in its group, then ``-outcomes``).
_READS = {"projector": ("findings", "dead_letter", "verdicts")}
#: What each service writes (its reads are the events topic, in its group).
_WRITES = {"shipper": ("events",), "publisher": ("events",), "projector": ("views", "dead_letter"),
           "auditor": ("findings", "dead_letter", "verdicts"), "archiver": ("dead_letter",)}
#: The services :func:`service_acls` knows, and their default consumer groups.
SERVICES = {"shipper": None, "publisher": None, "projector": "dsh-projector", "auditor": "dsh-auditor",
            "archiver": "dsh-archiver"}


def service_acls(principal: str, service: str, names: TopicNames = TopicNames(),
                 group: str | None = None) -> list[Acl]:
    """The least a ``service`` (one of :data:`SERVICES`) needs, on topics that
    exist (an operator created them): every pipeline topic described and its
    settings checked; the events topic read by a consumer (in ``group``, by
    default its own) or written by a producer; the projector's reads of the
    findings and dead letters it indexes; the outputs it writes; the
    auditor's transactional ids (its group, then ``.``)."""
    topics = {"events": names.events, "views": names.views, "findings": names.findings,
              "dead_letter": names.dead_letter, "verdicts": names.verdicts}
    acls = [Acl(principal, "topic", name, operation, "literal")
            for name in topics.values() for operation in ("Describe", "DescribeConfigs")]
    acls += [Acl(principal, "topic", topics[topic], "Write", "literal") for topic in _WRITES[service]]
    group = group or SERVICES[service]
    if group is not None:
        acls += [Acl(principal, "topic", names.events, "Read", "literal")]
        acls += [Acl(principal, "group", group, operation, "literal") for operation in ("Read", "Describe")]
    if group is not None and service in _READS:
        acls += [Acl(principal, "topic", topics[topic], "Read", "literal") for topic in _READS[service]]
        acls += [Acl(principal, "group", f"{group}-outcomes", operation, "literal")
                 for operation in ("Read", "Describe")]
    if service == "auditor":
        acls += [Acl(principal, "transactional-id", f"{group}.", operation) for operation in ("Write", "Describe")]
    return acls


def kafka_acls_commands(acls: list[Acl], bootstrap: str = "BROKER:9092") -> list[str]:
    """``kafka-acls.sh`` command lines granting ``acls``."""
    flag = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}
    return [f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal {acl.principal} "
            f"--operation {acl.operation} {flag[acl.resource]} '{acl.prefix}' --resource-pattern-type {acl.pattern}"
            for acl in acls]


_RESOURCE = {"topic": 2, "group": 3, "transactional-id": 5}
_OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8, "DescribeConfigs": 10}
_PATTERN = {"literal": 3, "prefixed": 4}
_ALLOW = 3


async def grant(admin_config: KafkaConfig, acls: list[Acl]) -> None:
    """Create ``acls`` on the cluster, as a principal allowed to (aiokafka has
    no ACL call: this sends Kafka's CreateAcls request itself, one per ACL)."""
    admin = make_admin(admin_config)
    await admin.start()
    try:
        node = next(iter(admin._client.cluster.brokers())).nodeId
        for acl in acls:
            response = await admin._client.send(node, CreateAclsRequest(
                _RESOURCE[acl.resource], acl.prefix, _PATTERN[acl.pattern], acl.principal, "*",
                _OPERATION[acl.operation], _ALLOW))
            failed = [result for result in response.creation_responses if result[0] != 0]
            if failed:
                raise ClusterUnavailableError(f"the cluster refused to grant {acl}: error {failed[0][0]} "
                                              f"{failed[0][1] or ''}".rstrip())
    finally:
        await admin.close()
