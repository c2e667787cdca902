"""The option groups and argument types the ``dsh-pipeline`` commands share:
the Kafka connection (``--bootstrap``, topics, replication, retention), the
delivery deadline of producing commands, the consumer services' group and
batch options, log and ops (metrics) options, and the value parsers behind
``--format``, ``--retention``, ``--listen`` and ``--upstream``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the services are imported by the commands that run them
    from consumers.runtime.config import ServiceConfig

__all__ = ["add_consumer_options", "add_delivery_option", "add_kafka_options", "add_log_options", "add_ops_options",
           "formats", "host_port", "positive_seconds", "retention", "upstream"]


def formats(text: str) -> tuple[int, ...]:
    """``--format``: one session format, or a comma-separated mix (``0,3,4``)."""
    from producers.simulator import FORMATS
    try:
        formats = tuple(int(part) for part in text.split(","))
    except ValueError:
        formats = ()
    if not formats or any(version not in FORMATS for version in formats):
        raise argparse.ArgumentTypeError(f"expected formats among {', '.join(map(str, FORMATS))} (e.g. 4 or 0,3,4), "
                                         f"got {text!r}")
    return formats


def retention(text: str) -> dict[str, int]:
    """``--retention``: ``TOPIC=MS`` pairs, comma-separated (TOPIC one of :data:`RETAINED`; -1 keeps forever)."""
    from dsh_kafka.topics import RETAINED
    retention: dict[str, int] = {}
    for part in filter(None, (item.strip() for item in text.split(","))):
        topic, _, value = part.partition("=")
        if topic not in RETAINED or not value.lstrip("-").isdigit() or int(value) < -1:
            raise argparse.ArgumentTypeError(f"expected TOPIC=MS pairs with TOPIC one of {', '.join(RETAINED)} and "
                                             f"MS -1 (forever) or more, got {part!r}")
        retention[topic] = int(value)
    return retention


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return seconds


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8787 or 0.0.0.0:8787)")
    return host.strip("[]"), int(port)


def upstream(text: str) -> str:
    from urllib.parse import urlsplit
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def add_kafka_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $DSH_KAFKA_BOOTSTRAP or the local broker)")
    parser.add_argument("--topic-prefix", default="", help="prefix for the pipeline's topic names, ending in '.', "
                                                           "'-' or '_' (eco3. gives eco3.dsh.session-events)")
    from dsh_kafka.topics import DEFAULT_PARTITIONS
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                        help=f"partitions of newly created topics (default {DEFAULT_PARTITIONS})")
    parser.add_argument("--no-create-topics", action="store_true",
                        help="only verify the topics (a cluster where they are created by its operators)")
    parser.add_argument("--replication", type=int, metavar="N",
                        help="copies of each partition of new topics, never lowered to the brokers up; existing "
                             "topics must have at least these (default: the cluster's default.replication.factor)")
    parser.add_argument("--min-insync-replicas", type=int, metavar="N",
                        help="copies that must have a record before it counts as written; existing topics must "
                             "have at least this (default: all but one)")
    parser.add_argument("--retention", type=retention, default={}, metavar="TOPIC=MS[,...]",
                        help="retention of new topics: events, findings, dead-letter (milliseconds; -1, the "
                             "default, keeps forever; the views topic is compacted)")
    parser.add_argument("--wait-for-cluster", type=float, default=30.0, metavar="SECONDS",
                        help="while no broker answers at all, a broker the cluster lists does not answer, or fewer "
                             "are up than a new topic's copies, try again with backoff this long (default 30; 0: "
                             "fail at once); a broker that refuses this client is named at once")


def add_delivery_option(parser: argparse.ArgumentParser, kept: str) -> None:
    from dsh_kafka.config import ProducerSettings
    default = ProducerSettings.delivery_timeout_s
    parser.add_argument("--delivery-timeout", type=positive_seconds, default=default, metavar="SECONDS",
                        help="while the cluster cannot take records (fewer brokers up than the topic's "
                             "min.insync.replicas, no leader) the command waits and resumes once it can; after this "
                             f"long without room or acknowledgement it stops with DeliveryTimeoutError, exit 69 "
                             f"(default {default:g}): {kept}")


def add_consumer_options(parser: argparse.ArgumentParser, config_class: type[ServiceConfig]) -> None:
    """The options every consumer service shares, defaulted from its configuration class."""
    # each service's class gives its group a default (ServiceConfig has none)
    group = next(field.default for field in dataclasses.fields(config_class) if field.name == "group")
    parser.add_argument("--group", default=group, help=f"consumer group (default {group})")
    parser.add_argument("--max-records", type=int, default=config_class.max_records,
                        help="records per poll batch (one persist and commit each)")
    parser.add_argument("--hot-sessions", type=int, default=config_class.hot_sessions,
                        help="sessions kept in memory; colder ones are reloaded from the service's state")
    parser.add_argument("--session-timeout", type=float, default=config_class.session_timeout_ms / 1000,
                        help="seconds without a heartbeat before the group moves this member's partitions "
                             f"(default {config_class.session_timeout_ms / 1000:g}; raise it on loaded hosts)")
    parser.add_argument("--instance-id", default=None,
                        help="a static group member id, unique per process (e.g. the host name): a restart within "
                             "the session timeout keeps its partitions, no rebalance")
    add_ops_options(parser)
    add_kafka_options(parser)


def add_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="the command's own log lines on stderr (default INFO; the Kafka client's: WARNING and "
                             "up, each repeat of one within a minute counted into one line)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="log lines as text (default) or one JSON object each, and nothing else on stderr: "
                             "time, level, logger, service, message and, where known, topic, partition, offset, "
                             "session, count, reason")


def add_ops_options(parser: argparse.ArgumentParser) -> None:
    add_log_options(parser)
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus /metrics and /healthz on this port (default 0: not at all)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="the address that port binds to (default 127.0.0.1: this host only; 0.0.0.0 for "
                             "every interface, as a container needs)")
