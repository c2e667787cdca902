"""The commands that publish: a simulated fleet (``simulate``) and real dsh
agents through a worker bridge (``worker``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
from pathlib import Path

from dsh_core.errors import PipelineError
from dsh_pipeline.exit_codes import EXIT_INTERRUPTED, EXIT_OK

__all__ = ["simulate", "worker"]


def simulate(args: argparse.Namespace) -> int:
    """Publish the fleet and write its manifest; SIGINT or SIGTERM stops it
    within a record, and the manifest (marked partial) holds what was sent."""
    from dsh_kafka.config import ProducerSettings
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.runtime import prepare_command_topics, resolve_kafka, run_until_signal
    from dataclasses import replace
    from dsh_kafka.errors import DeliveryTimeoutError
    from producers.publisher import Publisher, acknowledged
    from dsh_core.jsonvalue import encode_json
    from dsh_core.storage.writer import replace_file
    from producers.fleet import fleet, formats_summary, manifest
    from producers.simulator import FaultPlan, SimulatorConfig
    from dsh_pipeline.log_lines import configure_logging

    configure_logging(args.log_level, args.log_format, args.command)
    kafka = resolve_kafka(args.bootstrap, f"dsh-pipeline-{args.command}")
    names = TopicNames.with_prefix(args.topic_prefix)
    faults = FaultPlan(**{kind: getattr(args, f"fault_{kind}") for kind in
                          ("unlogged", "dropped", "duplicate", "lossless", "unknown")})
    config = SimulatorConfig(sessions=args.sessions, seed=args.seed, max_turns=args.max_turns, faults=faults,
                             formats=args.format)
    progress = _Progress(enabled=args.log_format == "text" and sys.stderr.isatty())
    delivery = ProducerSettings(delivery_timeout_s=args.delivery_timeout)

    async def main(stop: asyncio.Event) -> int:
        await prepare_command_topics(kafka, names, args)
        async with Publisher(kafka, names, delivery) as publisher:
            run = await fleet(config, publisher.send, on_batch=progress.add, stop=stop)
            try:
                await publisher.flush()  # what the manifest holds was acknowledged
            except DeliveryTimeoutError as error:
                run = replace(run, failure=run.failure or error)
        if run.failure is not None:  # the manifest of what the cluster acknowledged, then the error
            run = run.acknowledged_only(acknowledged)
        result = manifest(config, run.truths, partial=run.stopped, unfinished=run.unfinished)
        progress.done()
        if args.manifest:  # whole or not at all, whenever the run stops
            replace_file(Path(args.manifest), encode_json(result) + b"\n")
        written = f"; {'partial ' if run.stopped else ''}manifest {args.manifest}" if args.manifest else ""
        if run.failure is not None:
            print(f"stopped at the delivery deadline: {result['sessions']} of {config.sessions} sessions "
                  f"acknowledged whole ({len(run.unfinished)} cut short){written}", flush=True)
            raise run.failure
        if run.stopped:
            print(f"stopped: {result['sessions']} of {config.sessions} sessions sent whole "
                  f"({len(run.unfinished)} cut short), {result['events']} events{written}", flush=True)
            return EXIT_INTERRUPTED
        print(f"simulated {result['sessions']} sessions ({formats_summary(result)}), {result['events']} events, "
              f"{result['attestations']} attestations; injected {result['injected']}{written}")
        return EXIT_OK

    return run_until_signal(main)


def worker(args: argparse.Namespace) -> int:
    from dsh_kafka.config import ProducerSettings, Secret
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.runtime import prepare_command_topics, resolve_kafka
    from producers.bridge import AgentBridge
    from producers.asgi_server import AsgiServer
    from producers.gateway import LISTENER_LIMITS, Gateway, GatewayConfig
    from producers.gateway_admission import Credentials
    from producers.publisher import Publisher

    kafka = resolve_kafka(args.bootstrap, f"dsh-pipeline-{args.command}")
    names = TopicNames.with_prefix(args.topic_prefix)
    api_key = os.environ.get("DEEPSEEK_API_KEY")
    model_url = args.model_url or os.environ.get("DEEPSEEK_BASE_URL")
    if not api_key or not model_url:
        raise PipelineError("the dsh runtime needs DEEPSEEK_API_KEY and --model-url (or DEEPSEEK_BASE_URL)")
    workspace, home = Path(args.workspace).resolve(), Path(args.home).resolve()
    if args.runtime == "headless":
        from dsh_pipeline.dsh_runtimes import runtime_executable
        from producers.headless import HeadlessBridge, HeadlessConfig
        executable = runtime_executable(args.dsh_version)

        def bridge_for(publisher: Publisher, url: str, key: str) -> AgentBridge:
            return HeadlessBridge(HeadlessConfig(executable=executable, workspace=workspace, home=home, model_url=url,
                                                 api_key=Secret(key)), publisher)
    else:
        from producers.bridge import RuntimeConfig, WorkerBridge, find_runtime
        if not args.session_id:
            raise PipelineError("--session-id is required with --runtime jsonrpc (the headless runtime makes one)")
        executable, cordis = find_runtime()
        session_root = Path(args.session_root).resolve()

        def bridge_for(publisher: Publisher, url: str, key: str) -> AgentBridge:
            return WorkerBridge(RuntimeConfig(executable=executable, cordis_config=cordis, workspace=workspace,
                                              session_root=session_root, home=home, model_url=url,
                                              api_key=Secret(key), model=args.model), publisher)

    async def main() -> int:
        await prepare_command_topics(kafka, names, args)
        delivery = ProducerSettings(delivery_timeout_s=args.delivery_timeout)
        async with Publisher(kafka, names, delivery) as publisher, contextlib.AsyncExitStack() as stack:
            url, key = model_url, api_key
            if not args.no_gateway:  # the runtime's requests go through an attesting gateway on loopback, which
                key = secrets.token_urlsafe(32)  # only it may use: it shows this credential, the gateway the key
                gateway = Gateway(GatewayConfig(upstream=model_url, credentials=Credentials({"worker": Secret(key)}),
                                                upstream_key=Secret(api_key)), publisher.send)
                server = AsgiServer(gateway, "the gateway", limits=LISTENER_LIMITS)
                url = (await stack.enter_async_context(server)).url
            bridge = await stack.enter_async_context(bridge_for(publisher, url, key))
            session_id = args.session_id
            for text in args.prompt:
                result = await bridge.prompt(session_id, text)
                session_id = result.session_id
                print(f"session {result.session_id}: turn ended {result.end_reason}, {result.events} events "
                      f"published (last seq {result.last_seq})")
        return EXIT_OK

    return asyncio.run(main())


class _Progress:
    """A one-line progress display on a terminal (nothing otherwise)."""

    def __init__(self, enabled: bool) -> None:
        import time
        self.enabled, self.events, self.started, self._time = enabled, 0, time.monotonic(), time.monotonic
        self._shown = 0.0

    def add(self, events: int) -> None:
        self.events += events
        now = self._time()
        if self.enabled and now - self._shown > 0.2:
            self._shown = now
            rate = self.events / max(now - self.started, 1e-9)
            print(f"\r{self.events:>10,} events  {rate:>10,.0f}/s", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled:
            print(file=sys.stderr)
