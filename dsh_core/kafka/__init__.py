"""Kafka edge of dsh_core: topics, the record envelope, client configuration
and the local broker. The only part of dsh_core that knows about Kafka."""

from .broker import KAFKA_VERSION, LocalKafka, ensure_kafka_jars, probe_metadata
from .config import BOOTSTRAP_ENV, ConsumerSettings, KafkaConfig, ProducerSettings, Secret
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
from .topics import MAX_MESSAGE_BYTES, TopicNames, TopicSpec, ensure_topics, topic_specs

__all__ = [
    "Attestation", "BOOTSTRAP_ENV", "ConsumerSettings", "KAFKA_VERSION", "KIND_ATTESTATION", "KIND_HEADER",
    "KIND_RECORD", "KafkaConfig", "KafkaRecord", "LocalKafka", "MAX_MESSAGE_BYTES", "ProducerSettings", "Secret",
    "SessionRecord", "TopicNames", "TopicSpec", "attestation_record", "decode_kafka_record", "ensure_kafka_jars",
    "ensure_topics", "header_record", "probe_metadata", "record_from_line", "records_for_batch", "topic_specs",
    "where_of",
]
