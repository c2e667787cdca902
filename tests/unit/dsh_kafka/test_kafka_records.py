"""The events-topic record envelope (no broker needed)."""

from __future__ import annotations

import asyncio
import re
import ssl
import subprocess
import sys
from dataclasses import dataclass

import pytest

from dsh_core.errors import DecodeError, PipelineError
from dsh_kafka.clients import client_options, make_producer
from dsh_kafka.config import KafkaConfig, ProducerSettings, Secret
from dsh_kafka.records import (
    Attestation,
    attestation_record,
    decode_kafka_record,
    header_record,
    record_from_line,
    records_for_batch,
)
from dsh_kafka.topics import TopicNames, topic_specs
from dsh_core.session_header import SessionHeader
from dsh_core.storage.records import encode_records


@dataclass
class Fetched:
    key: bytes | None
    value: bytes | None
    headers: list
    topic: str = "dsh.session-events"
    partition: int = 3
    offset: int = 17


def chunk(seq: int, text: str) -> dict:
    return {"type": "assistant/chunk", "seq": seq, "time": seq,
            "data": {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": text}}}


def test_batch_records_pack_rows_and_round_trip():
    events = [{"type": "turn/start", "seq": 0, "time": 0, "data": {"turn": 1}}] + [chunk(i, "x") for i in range(1, 6)]
    records = records_for_batch("s-1", events)
    assert [(r.kind, r.seq, r.count) for r in records] == [("record", 0, 1), ("record", 1, 5)]
    assert b"".join(r.value + b"\n" for r in records) == encode_records(events)
    for record in records:
        fetched = Fetched(record.key, record.value, record.headers)
        assert decode_kafka_record(fetched) == record
        assert record_from_line("s-1", record.value) == record


def test_header_and_attestation_records():
    header = SessionHeader(id="s-1", createdAt=5, delegationDepth=0)
    record = header_record(header)
    assert (record.kind, record.value) == ("header", header.to_line())
    attestation = attestation_record("s-1", Attestation(1, 2, 40, "ab" * 32))
    assert attestation.seq == 40 and b'"algorithm":"sha256-jcs"' in attestation.value
    assert decode_kafka_record(Fetched(attestation.key, attestation.value, attestation.headers)) == attestation


@pytest.mark.parametrize("fetched, message", [
    (Fetched(None, b"{}", []), r"dsh\.session-events\[3\]@17: record has no key"),
    (Fetched(b"s", b"{}", [("dsh-kind", b"record")]), "header dsh-seq is missing"),
    (Fetched(b"s", b"{}", [("dsh-kind", b"blob"), ("dsh-seq", b"0"), ("dsh-count", b"1"), ("dsh-format", b"0")]),
     "dsh-kind 'blob' is not one of"),
    (Fetched(b"s", b"{}", [("dsh-kind", b"record"), ("dsh-seq", b"x"), ("dsh-count", b"1"), ("dsh-format", b"0")]),
     "must be integers"),
    (Fetched(b"\xff", b"{}", []), "key is not UTF-8"),
    (Fetched(b"s", b"{}", [("dsh-kind", b"record"), ("dsh-seq", b"-1"), ("dsh-count", b"1"), ("dsh-format", b"0")]),
     "must be safe integers from 0 to 2\\^53-1"),
    (Fetched(b"s", None, [("dsh-kind", b"record"), ("dsh-seq", b"1"), ("dsh-count", b"1"), ("dsh-format", b"0")]),
     "record has no value"),
])
def test_bad_envelopes_name_the_coordinates(fetched, message):
    with pytest.raises(DecodeError, match=message):
        decode_kafka_record(fetched)


def test_record_from_line_refuses_non_records():
    with pytest.raises(DecodeError, match="non-negative integer seq"):
        record_from_line("s", b'{"type":"x"}')


@pytest.mark.parametrize("prefix", ["eco3.", "eco3-", "eco3_"])
def test_a_topic_prefix_ends_in_a_separator(prefix):
    assert TopicNames.with_prefix(prefix).events == f"{prefix}dsh.session-events"


def test_a_topic_prefix_without_a_separator_is_refused_saying_what_to_give():
    with pytest.raises(PipelineError) as refused:
        TopicNames.with_prefix("eco3")
    assert str(refused.value) == ("--topic-prefix 'eco3' does not end in '.', '-', '_', so the topic names would run "
                                  "into it (eco3dsh.session-events): give 'eco3.' for eco3.dsh.session-events")
    done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--bootstrap", "127.0.0.1:1",
                           "--topic-prefix", "eco3"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (1, f"dsh-pipeline simulate: PipelineError: {refused.value}\n")


def test_topics_and_config():
    names = TopicNames.with_prefix("t1.")
    assert names.events == "t1.dsh.session-events" and names.dead_letter == "t1.dsh.dead-letter"
    specs = {s.name: s for s in topic_specs(names, 6)}
    assert specs[names.views].configs["cleanup.policy"] == "compact"
    events = specs[names.events].configs  # one 16 MiB record fits with its batch; the broker inflates every batch
    assert (events["max.message.bytes"], events["compression.type"]) == (str(16 * 1024 * 1024 + 65536), "uncompressed")
    assert {(s.replication, s.configs["min.insync.replicas"]) for s in specs.values()} == {(1, "1")}
    replicated = topic_specs(names, 6, 3)  # acks=all survives one broker
    assert {(s.replication, s.configs["min.insync.replicas"]) for s in replicated} == {(3, "2")}
    config = KafkaConfig("127.0.0.1:9092", sasl_mechanism="PLAIN", sasl_username="u", sasl_password=Secret("pw"))
    assert "pw" not in repr(config)

    async def built() -> tuple[bool, str]:  # the factory applies the security settings (no connection made)
        producer = make_producer(config, ProducerSettings())
        try:
            return producer._txn_manager is not None, producer.client._sasl_plain_password
        finally:
            await producer.stop()
    assert asyncio.run(built()) == (True, "pw")  # idempotent, and the SASL password reaches the client
    with pytest.raises(PipelineError, match="host:port"):
        KafkaConfig("localhost")


def test_security_settings_come_from_the_environment(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("from-a-file\n")
    config = KafkaConfig.from_env("b:9093", {"DSH_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
                                             "DSH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                                             "DSH_KAFKA_SASL_USERNAME": "dsh",
                                             "DSH_KAFKA_SASL_PASSWORD_FILE": str(secret)})
    options = client_options(config)
    assert (options["security_protocol"], options["sasl_mechanism"], options["sasl_plain_username"],
            options["sasl_plain_password"]) == ("SASL_SSL", "SCRAM-SHA-512", "dsh", "from-a-file")
    assert isinstance(options["ssl_context"], ssl.SSLContext) and "from-a-file" not in repr(config)
    assert "ssl_context" not in client_options(KafkaConfig.from_env("b:9092", {}))
    for environ, message in (
            ({"DSH_KAFKA_SECURITY_PROTOCOL": "TLS"}, "DSH_KAFKA_SECURITY_PROTOCOL=TLS is not one of PLAINTEXT, SSL"),
            ({"DSH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "SASL_PLAINTEXT needs DSH_KAFKA_SASL_MECHANISM"),
            ({"DSH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "DSH_KAFKA_SASL_MECHANISM": "PLAIN"},
             "SASL_PLAINTEXT needs DSH_KAFKA_SASL_USERNAME"),
            ({"DSH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "DSH_KAFKA_SASL_MECHANISM": "PLAIN",
              "DSH_KAFKA_SASL_USERNAME": "u"}, "SASL needs DSH_KAFKA_SASL_PASSWORD or DSH_KAFKA_SASL_PASSWORD_FILE"),
            ({"DSH_KAFKA_SECURITY_PROTOCOL": "SSL", "DSH_KAFKA_SSL_CAFILE": str(tmp_path / "ca.pem")},
             f"DSH_KAFKA_SSL_CAFILE={tmp_path / 'ca.pem'}: no such file")):
        with pytest.raises(PipelineError, match=re.escape(message)):
            KafkaConfig.from_env("b:9092", environ)
