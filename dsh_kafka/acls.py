"""The ACLs a principal running the pipeline needs on an authorizing cluster.

One list, from which ``dsh-pipeline acls`` prints the ``kafka-acls.sh``
commands an operator runs. Every pipeline topic, consumer group and
transactional id starts with a prefix the deployment chooses (``--topic-prefix``
before the topic names, ``dsh-`` before the groups, the auditor's group
before its transactional ids), so prefixed ACLs cover them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .topics import TopicNames

__all__ = ["Acl", "pipeline_acls", "kafka_acls_commands"]


@dataclass(frozen=True)
class Acl:
    """Allow ``principal`` ``operation`` on the resources whose name starts
    with ``prefix`` (``resource``: ``topic``, ``group``, ``transactional-id``)."""

    principal: str
    resource: str
    prefix: str
    operation: str


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


def kafka_acls_commands(acls: list[Acl], bootstrap: str = "BROKER:9092") -> list[str]:
    """``kafka-acls.sh`` command lines granting ``acls``."""
    flag = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}
    return [f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal {acl.principal} "
            f"--operation {acl.operation} {flag[acl.resource]} '{acl.prefix}' --resource-pattern-type prefixed"
            for acl in acls]
