"""Topic set-up against a cluster: create what is missing, verify the rest."""

from __future__ import annotations

import collections
import logging

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (GroupCoordinatorNotAvailableError, GroupLoadInProgressError, KafkaConnectionError,
                             NodeNotReadyError)
from aiokafka.protocol.offset import OffsetRequest, OffsetResetStrategy
from tenacity import AsyncRetrying, retry, retry_if_exception_type, retry_if_result, stop_after_delay, wait_exponential

from dsh_core.errors import BrokerAbsentError, ClusterUnavailableError, PipelineError

from .clients import make_admin, make_consumer
from .config import ConsumerSettings, KafkaConfig
from .diagnose import why_unreachable
from .topics import TopicLayout, TopicNames, TopicSpec, replication_for, topic_specs

__all__ = ["await_group_coordinator", "cluster_id", "end_offsets", "ensure_topics", "prepare_topics"]

_log = logging.getLogger("dsh.kafka")
#: How long topics just created may take to be listed and served by their leaders (seconds).
_READY_WITHIN = 30


async def prepare_topics(kafka: KafkaConfig, names: TopicNames, partitions: int, create: bool = True,
                         wait: float = 0.0, layout: TopicLayout = TopicLayout()) -> None:
    """Create or verify the pipeline's topics on ``kafka`` (every command's
    first call to the cluster: one that no broker answers is named here),
    with three copies of each partition on a cluster of three brokers or
    more (:func:`~.topics.replication_for`). While no broker answers at all,
    it tries again with exponential backoff for up to ``wait`` seconds (a
    cluster still starting); a broker that refuses this client is named at once.
    ``layout`` sets copies, acknowledgements and retention of missing topics."""
    retrying = AsyncRetrying(retry=retry_if_exception_type(BrokerAbsentError), stop=stop_after_delay(wait),
                             wait=wait_exponential(multiplier=0.5, max=5), reraise=True,
                             before_sleep=lambda state: _log.warning(
                                 "%s; trying again for up to %g s", state.outcome.exception().message, wait))
    async for attempt in retrying:
        with attempt:
            await _prepare_topics(kafka, names, partitions, create, layout)


async def _prepare_topics(kafka: KafkaConfig, names: TopicNames, partitions: int, create: bool,
                          layout: TopicLayout) -> None:
    admin = make_admin(kafka)
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster())["brokers"])  # a refused login may surface only here
    except (KafkaConnectionError, NodeNotReadyError):
        await admin.close()
        reason, absent = await why_unreachable(kafka)
        raise (BrokerAbsentError if absent else ClusterUnavailableError)(
            f"cannot reach the Kafka cluster at {kafka.bootstrap} over {kafka.security_protocol}: {reason}") from None
    try:
        replication = layout.replication or replication_for(brokers)
        if replication > brokers:
            raise PipelineError(f"--replication {replication}: the cluster has {brokers} broker(s), and each copy "
                                "of a partition needs its own")
        await ensure_topics(admin, topic_specs(names, partitions, replication, layout),
                            f"User:{kafka.sasl_username}" if kafka.sasl_username else "this client", create)
    finally:
        await admin.close()


@retry(retry=retry_if_result(bool), stop=stop_after_delay(_READY_WITHIN),
       wait=wait_exponential(multiplier=0.05, max=1), retry_error_callback=lambda state: state.outcome.result())
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
    topic is an error naming how to create it. An existing topic with a
    different partition count, cleanup policy or compression type, or a
    smaller message limit, is an error naming the topic and the setting.
    """
    existing = set(await admin.list_topics())
    missing = [spec for spec in specs if spec.name not in existing]
    if missing and not create:
        raise PipelineError(f"topic {missing[0].name} does not exist (or {principal} may not see it) and topics are "
                            f"not created here (--no-create-topics): create it with {missing[0].partitions} "
                            f"partitions and {dict(missing[0].configs)}")
    if missing:
        response = await admin.create_topics(
            [NewTopic(spec.name, spec.partitions, spec.replication, topic_configs=spec.configs) for spec in missing])
        for topic, code, *rest in response.topic_errors:
            if code == 29:  # TOPIC_AUTHORIZATION_FAILED
                raise ClusterUnavailableError(f"the cluster refused {principal} to create topic {topic}: it needs the "
                                              "ACLs "
                                    "`dsh-pipeline acls` lists")
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
        partitions = len(described[spec.name]["partitions"])
        if partitions != spec.partitions:
            raise PipelineError(f"topic {spec.name} exists with {partitions} partitions, expected {spec.partitions}: "
                                "keys would map to other partitions; use another topic prefix or recreate it")
        actual = configs.get(spec.name, {})
        for setting in ("cleanup.policy", "compression.type"):
            wanted_value = spec.configs.get(setting)
            if wanted_value and actual.get(setting) != wanted_value:
                raise PipelineError(f"topic {spec.name} has {setting}={actual.get(setting)}, expected {wanted_value} "
                                    f"(kafka-configs --alter --entity-type topics --entity-name {spec.name} "
                                    f"--add-config {setting}={wanted_value} sets it)")
        wanted = int(spec.configs.get("max.message.bytes", "0"))
        if wanted and int(actual.get("max.message.bytes", "0")) < wanted:
            raise PipelineError(f"topic {spec.name} has max.message.bytes={actual.get('max.message.bytes')}, "
                                f"below the {wanted} the pipeline needs")
