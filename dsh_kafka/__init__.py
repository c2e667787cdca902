"""The Kafka edge of dsh-pipeline: the record envelope of the events topic,
topic specs and set-up, client configuration and the only client factories.
It builds on :mod:`dsh_core`; nothing in ``dsh_core`` imports it."""

from .admin import ensure_topics, prepare_topics
from .clients import make_admin, make_consumer, make_producer
from .config import BOOTSTRAP_ENV, SERVICE_PRODUCER, ConsumerSettings, KafkaConfig, ProducerSettings, Secret
from .records import (
    KIND_ATTESTATION,
    KIND_HEADER,
    KIND_RECORD,
    Attestation,
    KafkaRecord,
    SessionRecord,
    attestation_record,
    decode_kafka_record,
    header_record,
    record_from_line,
    records_for_batch,
    where_of,
)
from .topics import DEFAULT_PARTITIONS, MAX_MESSAGE_BYTES, TopicNames, TopicSpec, topic_specs

__all__ = [
    "Attestation", "BOOTSTRAP_ENV", "ConsumerSettings", "DEFAULT_PARTITIONS", "KIND_ATTESTATION", "KIND_HEADER", "KIND_RECORD",
    "KafkaConfig", "KafkaRecord", "MAX_MESSAGE_BYTES", "ProducerSettings", "SERVICE_PRODUCER", "Secret",
    "SessionRecord", "TopicNames", "TopicSpec", "attestation_record", "decode_kafka_record", "ensure_topics",
    "header_record", "make_admin", "make_consumer", "make_producer", "prepare_topics", "record_from_line",
    "records_for_batch", "topic_specs", "where_of",
]
