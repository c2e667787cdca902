"""The only factories of Kafka clients: every consumer, producer and admin
client of the project is built here from the typed configuration, so
security settings and limits apply to all of them alike."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (ClusterAuthorizationFailedError, GroupAuthorizationFailedError, KafkaConnectionError,
                             NodeNotReadyError, TopicAuthorizationFailedError, TransactionalIdAuthorizationFailed)
from aiokafka.helpers import create_ssl_context


from .config import ConsumerSettings, KafkaConfig, ProducerSettings
from .errors import ClusterUnavailableError, DeliveryError
from .oauth import TokenProvider
from .topics import BATCH_OVERHEAD_BYTES

__all__ = ["AUTHORIZATION_ERRORS", "client_options", "make_admin", "make_consumer", "make_producer",
           "undelivered"]

#: What a cluster answers a principal that lacks an ACL.
AUTHORIZATION_ERRORS = (TopicAuthorizationFailedError, GroupAuthorizationFailedError,
                        TransactionalIdAuthorizationFailed, ClusterAuthorizationFailedError)


def undelivered(message: str, error: BaseException | None) -> DeliveryError | ClusterUnavailableError:
    """The error for records the cluster did not take: a refusal for lack
    of an ACL is :class:`ClusterUnavailableError` (it needs the operator),
    anything else :class:`DeliveryError`."""
    if isinstance(error, AUTHORIZATION_ERRORS):
        return ClusterUnavailableError(f"{message}: the cluster refused this client ({type(error).__name__}); it needs "
                                       "the ACLs `dsh-pipeline acls` lists")
    return DeliveryError(f"{message}: {type(error).__name__}: {error}")


def client_options(kafka: KafkaConfig) -> dict[str, Any]:
    """The aiokafka options every client of ``kafka`` gets: address,
    identity, security (a TLS context from the configured PEM files)."""
    options: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap, "client_id": kafka.client_id,
                               "security_protocol": kafka.security_protocol}
    if kafka.sasl_mechanism:
        options["sasl_mechanism"] = kafka.sasl_mechanism
        options["sasl_plain_username"] = kafka.sasl_username
        options["sasl_plain_password"] = kafka.sasl_password.reveal() if kafka.sasl_password else None
    if kafka.sasl_oauth_token is not None:
        options["sasl_oauth_token_provider"] = TokenProvider(kafka.sasl_oauth_token)
    if kafka.uses_tls:
        options["ssl_context"] = create_ssl_context(cafile=kafka.ssl_cafile, certfile=kafka.ssl_certfile,
                                                    keyfile=kafka.ssl_keyfile)
    options.update(kafka.extra)
    return options


def make_producer(kafka: KafkaConfig, settings: ProducerSettings = ProducerSettings(), *,
                  transactional_id: str | None = None) -> AIOKafkaProducer:
    """An idempotent ``acks=all`` producer (transactional with an id)."""
    producer = AIOKafkaProducer(**client_options(kafka), enable_idempotence=True, acks="all",
                                linger_ms=settings.linger_ms, compression_type=settings.compression,
                                max_batch_size=settings.max_batch_bytes,
                                max_request_size=settings.max_record_bytes + BATCH_OVERHEAD_BYTES,
                                request_timeout_ms=settings.request_timeout_ms, transactional_id=transactional_id)
    if transactional_id is not None:
        _retry_lost_lookups(producer.client)
    return producer


def _retry_lost_lookups(client: Any) -> None:
    """A coordinator lookup whose connection closes under it (its broker
    going down) raises ``KafkaConnectionError``, which aiokafka's
    transactional sender does not retry: the sender dies and the producer
    can commit nothing more (an auditor exited so in a two-broker outage).
    It is raised as ``NodeNotReadyError`` instead, which the sender retries
    after a metadata refresh, as it does a broker that is not up yet.
    (aiokafka internals: the version is pinned.)"""
    lookup = client.coordinator_lookup

    async def retried(coordinator_type: Any, coordinator_key: str) -> int:
        try:
            return await lookup(coordinator_type, coordinator_key)
        except KafkaConnectionError as error:
            raise NodeNotReadyError(f"the coordinator lookup's connection closed: {error}") from error

    client.coordinator_lookup = retried


def make_consumer(kafka: KafkaConfig, settings: ConsumerSettings, *topics: str) -> AIOKafkaConsumer:
    """A consumer of ``topics`` (none: partitions are assigned by hand)
    that never commits on its own."""
    return AIOKafkaConsumer(*topics, **client_options(kafka), group_id=settings.group_id, enable_auto_commit=False,
                            auto_offset_reset=settings.auto_offset_reset,
                            max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
                            fetch_max_bytes=settings.fetch_max_bytes, session_timeout_ms=settings.session_timeout_ms,
                            heartbeat_interval_ms=settings.heartbeat_interval_ms,
                            max_poll_interval_ms=settings.max_poll_interval_ms,
                            group_instance_id=settings.group_instance_id, isolation_level=settings.isolation_level)


def make_admin(kafka: KafkaConfig, *, request_timeout_ms: int = 40_000) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**client_options(kafka), request_timeout_ms=request_timeout_ms)
