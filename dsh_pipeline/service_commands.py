"""The long-running commands: the shipper and the consumer services, each
with its log lines and ops port, until SIGTERM or SIGINT drains it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dsh_pipeline.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED

if TYPE_CHECKING:
    from dsh_kafka.config import Secret
    from dsh_pipeline.ops_server import HealthCheck

__all__ = ["api_tokens", "archive", "audit", "gateway", "project", "redrive_key", "serve", "service_config", "ship"]


def ship(args: argparse.Namespace) -> int:
    from dsh_kafka.admin import cluster_id
    from dsh_kafka.config import ProducerSettings
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.runtime import prepare_command_topics
    from dsh_pipeline.runtime import resolve_kafka, run_until_signal
    from producers.publisher import Publisher
    from producers.shipper import CHECKPOINTS_FILE, Checkpoints, Destination, Shipper, ShipperConfig, check_root

    config = ShipperConfig(root=Path(args.root), state_dir=Path(args.state or Path(args.root) / ".dsh-shipper"),
                           poll_seconds=args.poll, once=args.once, summary_seconds=args.summary_every,
                           rescan_seconds=args.rescan_every)

    def report(line: str) -> None:
        print(f"dsh-pipeline ship: {line}", file=sys.stderr, flush=True)

    # local mistakes are named before the cluster is asked anything
    refused_layouts = _lay_out(args.layout_from, config.root, report) if args.layout_from else 0
    check_root(config.root)
    Checkpoints(config.state_dir / CHECKPOINTS_FILE)
    kafka = resolve_kafka(args.bootstrap, f"dsh-pipeline-{args.command}")
    names = TopicNames.with_prefix(args.topic_prefix)
    shipping = False  # healthy while the shipper's run loop runs

    def health() -> tuple[bool, str]:
        return (True, "shipping") if shipping else (False, "not shipping")

    async def main(stop: asyncio.Event) -> int:
        nonlocal shipping
        await prepare_command_topics(kafka, names, args)
        destination = Destination(await cluster_id(kafka), names.events)
        async with Publisher(kafka, names, ProducerSettings(delivery_timeout_s=args.delivery_timeout)) as publisher:
            shipping = True
            try:
                with Shipper(config, publisher.send, publisher.flush, report, say=report,
                             destination=destination) as shipper:
                    summary = await shipper.run(stop)
            finally:
                shipping = False
        if not config.once:
            return EXIT_OK  # following ends when it is stopped: refusals were said, and counted in the metrics
        if stop.is_set():
            return EXIT_INTERRUPTED
        # a log refused by an earlier pass is still not shipped
        return EXIT_REFUSED if summary.refused or summary.skipped or refused_layouts else EXIT_OK

    with _ops_server(args, health):
        return run_until_signal(main)


def _lay_out(sources: list[str], root: Path, report) -> int:
    """Copy session logs into ``root`` in dsh's layout; returns how many were refused."""
    from dsh_core.errors import DshError
    from dsh_core.inspect import expand_inputs
    from dsh_core.lay_out import lay_out

    laid = kept = refused = 0
    for given in sources:
        for path in expand_inputs(given):
            try:
                target = lay_out(path, root)
            except DshError as error:
                refused += 1
                report(f"refused {type(error).__name__}: {error.message}")
                continue
            except OSError as error:
                refused += 1
                report(f"refused: {path}: cannot be laid out: {error.strerror or error}")
                continue
            laid, kept = (laid + 1, kept) if target is not None else (laid, kept + 1)
    report(f"laid out {laid} session logs in {root} ({kept} were there already, {refused} refused)")
    return refused


def gateway(args: argparse.Namespace) -> int:
    from dsh_core.errors import DshError
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.runtime import prepare_command_topics, resolve_kafka, run_until_signal
    from producers.asgi_server import AsgiServer
    from dsh_kafka.config import Secret
    from producers.gateway import LISTENER_LIMITS, Gateway, GatewayConfig
    from producers.gateway_admission import Credentials, read_secret_file
    from producers.publisher import Publisher

    host, port = args.listen
    config = GatewayConfig(upstream=args.upstream, read_timeout=args.read_timeout,
                           credentials=Credentials.from_file(_credentials_file(args.credentials_file)),
                           upstream_key=Secret(read_secret_file(args.upstream_key_file, "--upstream-key-file").strip())
                           if args.upstream_key_file else None,
                           session_rate=args.session_rate, session_burst=3 * args.session_rate)
    kafka = resolve_kafka(args.bootstrap, f"dsh-pipeline-{args.command}")
    names = TopicNames.with_prefix(args.topic_prefix)
    serving = False
    log = logging.getLogger("dsh_pipeline.gateway")

    def health() -> tuple[bool, str]:
        return (True, "serving") if serving else (False, "not serving")

    async def main(stop: asyncio.Event) -> int:
        nonlocal serving
        await prepare_command_topics(kafka, names, args)
        _open_files_up_to_the_hard_limit()  # --max-connections counts against a quarter of the soft limit
        async with Publisher(kafka, names) as publisher, \
                AsgiServer(Gateway(config, publisher.send), "the gateway", host, port,
                           dataclasses.replace(LISTENER_LIMITS, max_connections=args.max_connections)) as server:
            print(f"dsh-pipeline gateway: {server.url} forwards to {config.upstream}; point DEEPSEEK_BASE_URL at it",
                  file=sys.stderr, flush=True)
            serving = True
            _collect_garbage_less_often()
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)  # attestations are confirmed once a second
                try:
                    await publisher.flush()
                except DshError as error:
                    log.error("attestations were not acknowledged: %s", error)
            serving = False
        return EXIT_OK

    with _ops_server(args, health):
        return run_until_signal(main)


#: The gateway's credentials file, when ``--credentials-file`` is not given.
CREDENTIALS_FILE_ENV = "DSH_GATEWAY_CREDENTIALS_FILE"


def _credentials_file(given: str | None) -> str:
    from dsh_core.errors import PipelineError
    path = given or os.environ.get(CREDENTIALS_FILE_ENV)
    if not path:
        raise PipelineError(f"the gateway lets only the fleet's clients through: --credentials-file FILE "
                            f"(NAME SECRET per line, mode 0600) or ${CREDENTIALS_FILE_ENV}")
    return path


#: Tokens of the read API, comma-separated (or ``--tokens-file``).
TOKENS_ENV = "DSH_API_TOKENS"


def api_tokens(tokens_file: str | None) -> frozenset[str]:
    """The read API's bearer tokens: one per line of ``tokens_file`` (``#``
    starts a comment), and those of ``$DSH_API_TOKENS``; none is an error,
    and so is a file its group or others may read or change."""
    from dsh_core.errors import PipelineError
    from producers.gateway_admission import read_secret_file
    tokens = {token.strip() for token in os.environ.get(TOKENS_ENV, "").split(",") if token.strip()}
    if tokens_file:  # a token opens every transcript
        lines = read_secret_file(tokens_file, "--tokens-file").splitlines()
        tokens |= {line.split("#", 1)[0].strip() for line in lines} - {""}
    if not tokens:
        raise PipelineError(f"the read API needs a token: --tokens-file FILE (one per line) or ${TOKENS_ENV}")
    return frozenset(tokens)


def serve(args: argparse.Namespace) -> int:
    from consumers.projector.store_reader import StoreReader
    from dsh_pipeline.prices import load_prices
    from dsh_pipeline.runtime import run_until_signal
    from dsh_pipeline.web import read_api
    from dsh_pipeline.web.app import API_LIMITS
    from producers.asgi_server import AsgiServer

    tokens = api_tokens(args.tokens_file)
    prices = load_prices(args.prices)
    reader = StoreReader(args.store)
    host, port = args.listen
    serving = False

    def health() -> tuple[bool, str]:
        return (True, "serving") if serving else (False, "not serving")

    async def main(stop: asyncio.Event) -> int:
        nonlocal serving
        app = read_api(reader, tokens, cors_origins=tuple(args.cors_origin or ()), prices=prices)
        async with AsgiServer(app, "the read API", host, port, API_LIMITS,
                              trusted_proxies=tuple(args.trusted_proxy or ())) as server:
            print(f"dsh-pipeline serve: {server.url} (API under /api/v1, viewer at /) reads {reader.where}",
                  file=sys.stderr, flush=True)
            serving = True
            await stop.wait()
            serving = False
        return EXIT_OK

    try:
        with _ops_server(args, health):
            return run_until_signal(main)
    finally:
        reader.close()


def _consume(args: argparse.Namespace, make_service, make_companion=None) -> int:
    """Run one consumer service (and its companion, if any) until SIGTERM or
    SIGINT; either failing stops both; ``/healthz`` reads both."""
    from dsh_kafka.admin import await_group_coordinator
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.runtime import prepare_command_topics
    from dsh_pipeline.ops_server import consumers_health
    from dsh_pipeline.runtime import resolve_kafka, run_until_signal

    kafka = resolve_kafka(args.bootstrap, f"dsh-pipeline-{args.command}")
    names = TopicNames.with_prefix(args.topic_prefix)
    services = {}  # what /healthz checks: the service, once it exists

    async def main(stop: asyncio.Event) -> int:
        await prepare_command_topics(kafka, names, args)
        await await_group_coordinator(kafka, args.group)
        services[args.command] = make_service(kafka, names)
        if make_companion is not None:
            companion = make_companion(kafka, names)
            services[companion.name] = companion
        try:
            async with asyncio.TaskGroup() as running:
                for member in services.values():
                    running.create_task(member.run(stop))
        except ExceptionGroup as failed:  # the first failure is the one to report; the other was stopped by it
            raise failed.exceptions[0] from None
        return EXIT_OK

    with _ops_server(args, consumers_health(services)):
        return run_until_signal(main)


def _ops_server(args: argparse.Namespace, health: HealthCheck) -> contextlib.AbstractContextManager:
    """Log lines on stderr as ``--log-level`` and ``--log-format`` say, and
    ``/metrics`` and ``/healthz`` on ``--metrics-host``:``--metrics-port``
    for the command's lifetime (nothing without a port)."""
    from dsh_pipeline.log_lines import configure_logging
    configure_logging(args.log_level, args.log_format, args.command)
    if not args.metrics_port:
        return contextlib.nullcontext()
    from dsh_pipeline.ops_server import serve_ops
    return serve_ops(args.metrics_host, args.metrics_port, health)


def service_config(args: argparse.Namespace, config_class: type, kafka, names, **own):
    """A consumer service's configuration: the common options, then its own."""
    return config_class(kafka=kafka, topics=names, group=args.group, max_records=args.max_records,
                        hot_sessions=args.hot_sessions, session_timeout_ms=round(args.session_timeout * 1000),
                        instance_id=args.instance_id, redrive_key=redrive_key(), **own)


def redrive_key() -> Secret | None:
    """The key redrive marks are signed with, from the 0600 file
    ``$DSH_REDRIVE_KEY_FILE`` names; ``None`` when it is not set."""
    from dsh_core.errors import PipelineError
    from dsh_kafka.config import Secret
    from consumers.runtime.redrive_mark import MIN_KEY_CHARACTERS, REDRIVE_KEY_ENV
    from producers.gateway_admission import read_secret_file
    path = os.environ.get(REDRIVE_KEY_ENV)
    if not path:
        return None
    key = read_secret_file(path, f"${REDRIVE_KEY_ENV}").strip()
    if len(key) < MIN_KEY_CHARACTERS:
        raise PipelineError(f"${REDRIVE_KEY_ENV} {path}: the redrive key has {len(key)} characters, fewer than "
                            f"{MIN_KEY_CHARACTERS} (make one with `openssl rand -hex 32 > {path}`)")
    return Secret(key)


def project(args: argparse.Namespace) -> int:
    """The projection and, beside it, the index of findings and dead letters
    into the same store (group ``<group>-outcomes``)."""
    from consumers.projector import ProjectorConfig, projector_service
    from consumers.projector.outcomes import OutcomeIndex, OutcomeIndexConfig
    from consumers.runtime.store_backends import store_location
    from dsh_pipeline.prices import load_prices
    store, prices = store_location(args.store), load_prices(args.prices)
    return _consume(args, lambda kafka, names: projector_service(
        service_config(args, ProjectorConfig, kafka, names, store=store, price=prices.cost)),
        lambda kafka, names: OutcomeIndex(OutcomeIndexConfig(
            kafka=kafka, topics=names, group=f"{args.group}-outcomes", store=store,
            session_timeout_ms=round(args.session_timeout * 1000))))


def audit(args: argparse.Namespace) -> int:
    from consumers.auditor import AuditorConfig, auditor_service
    return _consume(args, lambda kafka, names: auditor_service(
        service_config(args, AuditorConfig, kafka, names, state=Path(args.state),
                        checkpoint_seconds=args.checkpoint_seconds, require_gateway=args.require_gateway,
                        wire_deadline_seconds=args.wire_deadline)))


def archive(args: argparse.Namespace) -> int:
    from consumers.archiver import ArchiverConfig, archiver_service
    return _consume(args, lambda kafka, names: archiver_service(
        service_config(args, ArchiverConfig, kafka, names, root=Path(args.root), v4_copies=args.v4_copies)))


#: Allocations between two young-generation collections (CPython's default: 700).
GARBAGE_THRESHOLDS = (10_000, 10, 10)


def _collect_garbage_less_often() -> None:
    """Spare a serving process most of the cyclic garbage collector's work.

    Nearly every object a proxied exchange makes is freed by reference
    counting (under load the collector found next to no cycles), yet with
    CPython's defaults it walked the young objects every 700 allocations
    and, now and then, every object the process holds, its imported modules
    included: about a tenth of the gateway's CPU at 200 streams. What exists
    once serving starts (modules, clients, the server) is frozen out of the
    collector's walks, and the young generation is collected every
    :data:`GARBAGE_THRESHOLDS` allocations (a pause of a few milliseconds,
    rarely). Cycles are still collected, only less often."""
    gc.freeze()
    gc.set_threshold(*GARBAGE_THRESHOLDS)


def _open_files_up_to_the_hard_limit() -> None:
    """Raise this process's soft limit on open files to its hard limit: a
    listener keeps at most a quarter of the soft limit's connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard != resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
