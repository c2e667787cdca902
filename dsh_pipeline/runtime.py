"""What every long-running command shares: the cluster, topics, signals."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Awaitable, Callable

import uvloop

from dsh_core.errors import PipelineError
from dsh_pipeline.kafka_jars import cache_root
from dsh_pipeline.local_kafka import BrokerState, probe_metadata, read_state
from dsh_kafka.admin import prepare_topics
from dsh_kafka.config import BOOTSTRAP_ENV, KafkaConfig
from dsh_kafka.topics import TopicLayout, TopicNames

__all__ = ["default_broker_dir", "local_broker", "prepare_command_topics", "remember_broker_dir", "resolve_kafka",
           "run_until_signal"]


def default_broker_dir() -> Path:
    return cache_root() / "broker"


def _remembered_file() -> Path:
    """Names the data folder ``kafka start --data-dir`` last started a broker in."""
    return cache_root() / "broker-data-dir"


def remember_broker_dir(data_dir: Path) -> None:
    """Note that ``kafka start --data-dir`` started the local broker in ``data_dir``."""
    _remembered_file().parent.mkdir(parents=True, exist_ok=True)
    _remembered_file().write_text(f"{data_dir.resolve()}\n")


def local_broker() -> tuple[Path, BrokerState | None]:
    """The local broker's data folder and, while the broker answers, its
    state: the default folder's broker, else the one ``kafka start
    --data-dir`` last started; the default folder when neither runs."""
    try:
        remembered = [Path(_remembered_file().read_text().strip())]
    except FileNotFoundError:
        remembered = []
    for data_dir in (default_broker_dir(), *remembered):
        state = read_state(data_dir)
        if state is not None and probe_metadata(state.client()):
            return data_dir, state
    return default_broker_dir(), None


def resolve_kafka(bootstrap: str | None, client_id: str) -> KafkaConfig:
    """``--bootstrap``, else ``$DSH_KAFKA_BOOTSTRAP``, else the broker that
    ``dsh-pipeline kafka start`` runs (:func:`local_broker`); otherwise a
    clear error. The clients call themselves ``client_id`` (broker logs,
    quotas and metrics tell the pipeline's commands apart by it)."""
    if bootstrap or os.environ.get(BOOTSTRAP_ENV):
        return replace(KafkaConfig.from_env(bootstrap), client_id=client_id)
    _, state = local_broker()
    if state is not None and state.admin is not None:
        raise PipelineError(f"the local broker at {state.bootstrap} is secured (`kafka start --secure`): give the "
                            f"command its service's configuration, --config {state.data_dir}/clients/SERVICE.toml")
    if state is not None:
        return KafkaConfig(bootstrap=state.bootstrap, client_id=client_id)
    raise PipelineError(f"no Kafka cluster: pass --bootstrap HOST:PORT, set {BOOTSTRAP_ENV}, "
                        "or start the local broker with `dsh-pipeline kafka start`")


async def prepare_command_topics(kafka: KafkaConfig, names: TopicNames, args: argparse.Namespace) -> None:
    """Create or verify the topics as a command's Kafka options say."""
    layout = TopicLayout(args.replication, args.min_insync_replicas, args.retention)
    await prepare_topics(kafka, names, args.partitions, create=not args.no_create_topics, wait=args.wait_for_cluster,
                         layout=layout)


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``main(stop)`` on a uvloop event loop; SIGTERM/SIGINT set
    ``stop`` so the service drains."""
    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await main(stop)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve())

