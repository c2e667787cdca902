"""Topic set-up against a cluster: create what is missing, verify the rest."""

from __future__ import annotations

import asyncio
import collections
import logging

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (GroupCoordinatorNotAvailableError, GroupLoadInProgressError, KafkaConnectionError,
                             KafkaTimeoutError, NodeNotReadyError, NotControllerError, RequestTimedOutError)
from aiokafka.protocol.offset import OffsetRequest, OffsetResetStrategy
from tenacity import (AsyncRetrying, RetryCallState, retry, retry_if_exception_type, retry_if_result, stop_after_delay,
                      wait_exponential)

from dsh_core.errors import DshError, PipelineError

from .clients import make_admin, make_consumer
from .config import ConsumerSettings, KafkaConfig
from .diagnose import why_unreachable
from .errors import BrokerAbsentError, BrokerOutageError, ClusterUnavailableError, TopicMismatchError
from .topics import TopicLayout, TopicNames, TopicSpec, topic_specs

__all__ = ["await_group_coordinator", "cluster_id", "end_offsets", "ensure_topics", "prepare_topics"]

_log = logging.getLogger("dsh.kafka")
#: How long topics just created may take to be listed and served by their leaders (seconds).
_READY_WITHIN = 30
#: How long one set-up request may wait for its broker (a paused broker answers nothing).
_REQUEST_MS = 15_000
#: What one broker's outage looks like to a client that reached the cluster
#: (a node down, paused, not yet fenced, or not yet known as the controller).
_NODE_ERRORS = (KafkaConnectionError, NodeNotReadyError, RequestTimedOutError, NotControllerError,
                KafkaTimeoutError, asyncio.TimeoutError)
#: create-topics error codes another attempt may not meet: REQUEST_TIMED_OUT,
#: INVALID_REPLICATION_FACTOR (fewer brokers up than copies), NOT_CONTROLLER.
_RETRIED_CODES = {7: "the request timed out", 38: "fewer brokers are up than the topic's copies",
                  41: "the broker asked was not the controller"}


def _failure(state: RetryCallState) -> str:
    """The message of the error that made tenacity try again (it calls back after a failed attempt only)."""
    error = state.outcome.exception() if state.outcome is not None else None
    return error.message if isinstance(error, DshError) else str(error)


def _last_result(state: RetryCallState) -> set[str]:
    """What the last attempt returned, once tenacity stops trying (it calls back after an attempt only)."""
    assert state.outcome is not None, "tenacity gives up only after an attempt"
    result: set[str] = state.outcome.result()
    return result


async def prepare_topics(kafka: KafkaConfig, names: TopicNames, partitions: int, create: bool = True,
                         wait: float = 0.0, layout: TopicLayout = TopicLayout()) -> None:
    """Create or verify the pipeline's topics on ``kafka`` (every command's
    first call to the cluster: one that no broker answers is named here).

    Missing topics get ``layout.replication`` copies (``None``: the cluster's
    ``default.replication.factor``), never fewer: with fewer brokers up than
    that, creating them fails. Existing topics are verified against the same
    (:func:`ensure_topics`). While no broker answers at all, or the cluster
    answers but a broker it lists does not (down or paused) or too few are
    up, it tries again with exponential backoff for up to ``wait`` seconds,
    each time anew from the bootstrap, so requests reach the brokers that
    serve; a broker that refuses this client is named at once.
    ``layout`` sets copies, acknowledgements and retention of missing topics."""
    retrying = AsyncRetrying(retry=retry_if_exception_type((BrokerAbsentError, BrokerOutageError)),
                             stop=stop_after_delay(wait), wait=wait_exponential(multiplier=0.5, max=5), reraise=True,
                             before_sleep=lambda state: _log.warning(
                                 "%s; trying again for up to %g s", _failure(state), wait))
    async for attempt in retrying:
        with attempt:
            await _prepare_topics(kafka, names, partitions, create, layout)


async def _prepare_topics(kafka: KafkaConfig, names: TopicNames, partitions: int, create: bool,
                          layout: TopicLayout) -> None:
    admin = make_admin(kafka, request_timeout_ms=_REQUEST_MS)
    started = False
    try:
        await admin.start()  # a broker of the bootstrap took this client (and its login)
        started = True
        replication = layout.replication or await _default_replication(admin)
        await ensure_topics(admin, topic_specs(names, partitions, replication, layout),
                            f"User:{kafka.sasl_username}" if kafka.sasl_username else "this client", create)
        return
    except _NODE_ERRORS as error:
        failure = error
    finally:
        await admin.close()  # before any probe: the diagnosis opens connections of its own
    if not started:
        reason, absent = await why_unreachable(kafka)
        raise (BrokerAbsentError if absent else ClusterUnavailableError)(
            f"cannot reach the Kafka cluster at {kafka.bootstrap} over {kafka.security_protocol}: {reason}") from None
    raise await _outage(kafka, failure) from None


async def _outage(kafka: KafkaConfig, error: BaseException) -> BrokerOutageError:
    """A broker of a cluster that took this client did not answer: tried
    again while the deadline allows. A client with credentials may also be
    refused only on its first request after the bootstrap (an expired
    token): the probe's reading is added, as the other possibility."""
    message = f"a broker of the Kafka cluster at {kafka.bootstrap} did not answer ({error}): it may be down or paused"
    if kafka.sasl_mechanism or kafka.uses_tls:
        reason, absent = await why_unreachable(kafka)
        if not absent:
            message += f"; if none is, {reason}"
    return BrokerOutageError(message)


async def _default_replication(admin: AIOKafkaAdminClient) -> int:
    """The cluster's ``default.replication.factor``: the copies of topics
    created without ``--replication``, as the cluster's operators set them."""
    node = (await admin.describe_cluster())["brokers"][0]["node_id"]
    [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(node),
                                                              {"default.replication.factor": None})])
    for _, _, _, _, entries, *_ in response.resources:
        for name, value, *_ in entries:
            if name == "default.replication.factor":
                return int(value)
    return 1  # Kafka's own default


@retry(retry=retry_if_result(bool), stop=stop_after_delay(_READY_WITHIN),
       wait=wait_exponential(multiplier=0.05, max=1), retry_error_callback=_last_result)
async def _unready(admin: AIOKafkaAdminClient, names: set[str]) -> set[str]:
    """Which of the topics just created are not ready yet: not listed, or
    with a partition whose leader does not answer for it. A broker learns
    of a new topic shortly after the controller made it, and names a new
    partition's leader a moment before that leader serves it: each client
    of the next command would meet that moment as errors it logs."""
    listed = set(await admin.list_topics())
    unready = names - listed
    leaders: dict[int, dict[str, list[int]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for topic in await admin.describe_topics(sorted(names & listed)):
        if topic["error_code"] or not topic["partitions"]:
            unready.add(topic["topic"])
        for partition in topic["partitions"]:
            leaders[partition["leader"]][topic["topic"]].append(partition["partition"])
    for node, topics in leaders.items():
        if node < 0:  # no leader yet
            unready.update(topics)
            continue
        try:  # the leader's own answer: its latest offset (ListOffsets; aiokafka's admin has no call for it)
            response = await admin._client.send(node, OffsetRequest(
                -1, 0, [(topic, [(partition, OffsetResetStrategy.LATEST) for partition in partitions])
                        for topic, partitions in topics.items()]))
        except (KafkaConnectionError, NodeNotReadyError):  # asked again, as a leader that did not answer yet
            unready.update(topics)
            continue
        unready.update(topic for topic, answers in response.topics if any(answer[1] for answer in answers))
    return unready


async def await_group_coordinator(kafka: KafkaConfig, group: str) -> None:
    """Wait (up to 30 s) until the cluster names ``group``'s coordinator: a
    new cluster makes its offsets topic at the first such question and says
    "not available" until it is ready, which a consumer logs as an error at
    each try."""
    admin = make_admin(kafka)
    await admin.start()
    try:
        async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((GroupCoordinatorNotAvailableError, GroupLoadInProgressError)),
                stop=stop_after_delay(_READY_WITHIN), wait=wait_exponential(multiplier=0.05, max=1),
                retry_error_callback=lambda state: None):  # the consumer goes on asking, as before
            with attempt:
                await admin.find_coordinator(group)
    finally:
        await admin.close()


async def cluster_id(kafka: KafkaConfig) -> str:
    """The id of the cluster at ``kafka.bootstrap``, from its metadata: what
    tells one cluster from another whatever address it is reached at."""
    admin = make_admin(kafka)
    try:
        await admin.start()
        found = (await admin.describe_cluster()).get("cluster_id")
    except (KafkaConnectionError, NodeNotReadyError) as error:
        raise ClusterUnavailableError(f"cannot read the id of the Kafka cluster at {kafka.bootstrap}: {error}") from None
    finally:
        await admin.close()
    if not found:
        raise PipelineError(f"the Kafka cluster at {kafka.bootstrap} does not say its id (metadata version 2 or "
                            "later: Kafka 0.10.1 or later)")
    return found


async def end_offsets(kafka: KafkaConfig, topic: str) -> dict[int, int]:
    """The end offset of every partition of ``topic``."""
    consumer = make_consumer(kafka, ConsumerSettings(group_id=None), topic)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(partitions)).items()}
    finally:
        await consumer.stop()


async def ensure_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec], principal: str = "this client",
                        create: bool = True) -> None:
    """Create missing topics and verify existing ones (idempotent).

    ``admin`` is a started admin client; without ``create`` a missing
    topic is an error naming how to create it. A topic the cluster cannot
    create yet (fewer brokers up than its copies) is a
    :class:`BrokerOutageError`. An existing topic with a different partition
    count, fewer copies of a partition or a lower ``min.insync.replicas``
    than asked, another cleanup policy or compression type, or a smaller
    message limit, is a :class:`TopicMismatchError` naming the topic, what
    it has and what was asked.
    """
    existing = set(await admin.list_topics())
    missing = [spec for spec in specs if spec.name not in existing]
    if missing and not create:
        raise PipelineError(f"topic {missing[0].name} does not exist (or {principal} may not see it) and topics are "
                            f"not created here (--no-create-topics): create it with {missing[0].partitions} "
                            f"partitions and {dict(missing[0].configs)}")
    if missing:
        replication = {spec.name: spec.replication for spec in missing}
        response = await admin.create_topics(
            [NewTopic(spec.name, spec.partitions, spec.replication, topic_configs=spec.configs) for spec in missing])
        for topic, code, *rest in response.topic_errors:
            if code == 29:  # TOPIC_AUTHORIZATION_FAILED
                raise ClusterUnavailableError(f"the cluster refused {principal} to create topic {topic}: it needs the "
                                              "ACLs "
                                    "`dsh-pipeline acls` lists")
            if code in _RETRIED_CODES:
                raise BrokerOutageError(f"creating topic {topic} with {replication[topic]} copies failed: "
                                        f"{_RETRIED_CODES[code]} ({rest[-1] if rest else f'error {code}'})")
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (a concurrent creator)
                raise PipelineError(f"creating topic {topic} failed: error {code} {rest[-1] if rest else ''}")
        unready = await _unready(admin, {spec.name for spec in missing})
        if unready:
            raise PipelineError(f"topics {', '.join(sorted(unready))} were created, but the cluster does not list "
                                f"them, or their partitions' leaders do not answer for them, after {_READY_WITHIN} s")
    present = [spec for spec in specs if spec.name in existing]
    if not present:
        return
    described = {item["topic"]: item for item in await admin.describe_topics([s.name for s in present])}
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, s.name) for s in present])
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for code, message, _, name, entries, *_ in response.resources:
            if code == 29:  # TOPIC_AUTHORIZATION_FAILED
                raise ClusterUnavailableError(f"the cluster refused {principal} to read the configs of topic {name}: "
                                              "it needs the ACLs `dsh-pipeline acls` lists")
            if code != 0:
                raise PipelineError(f"reading the configs of topic {name} failed: error {code} {message or ''}")
            configs[name] = {entry[0]: entry[1] for entry in entries}
    for spec in present:
        _verify(spec, described[spec.name]["partitions"], configs.get(spec.name, {}))


def _verify(spec: TopicSpec, partitions: list[dict], actual: dict[str, str]) -> None:
    """An existing topic against its spec (:func:`ensure_topics`)."""
    if len(partitions) != spec.partitions:
        raise TopicMismatchError(f"topic {spec.name} exists with {len(partitions)} partitions, expected "
                                 f"{spec.partitions}: keys would map to other partitions; use another topic prefix "
                                 "or recreate it")
    copies = min(len(partition["replicas"]) for partition in partitions)
    if copies < spec.replication:
        raise TopicMismatchError(f"topic {spec.name} has {copies} copies of a partition, {spec.replication} were asked "
                                 "(--replication): a weaker topic is not used in its place; reassign its partitions "
                                 "(kafka-reassign-partitions) or use another topic prefix")
    for setting in ("cleanup.policy", "compression.type"):
        wanted_value = spec.configs.get(setting)
        if wanted_value and actual.get(setting) != wanted_value:
            raise TopicMismatchError(f"topic {spec.name} has {setting}={actual.get(setting)}, expected {wanted_value} "
                                     f"(kafka-configs --alter --entity-type topics --entity-name {spec.name} "
                                     f"--add-config {setting}={wanted_value} sets it)")
    for setting, what in (("min.insync.replicas", "--min-insync-replicas"), ("max.message.bytes", "the pipeline")):
        wanted = int(spec.configs.get(setting, "0"))
        if wanted and int(actual.get(setting, "0")) < wanted:
            raise TopicMismatchError(f"topic {spec.name} has {setting}={actual.get(setting)}, below the {wanted} "
                                     f"{what} asked (kafka-configs --alter --entity-type topics --entity-name "
                                     f"{spec.name} --add-config {setting}={wanted} sets it)")
