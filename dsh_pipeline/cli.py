"""``dsh-pipeline``: the command line (composition root of the project)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Sequence

from dsh_core.errors import DshError
from dsh_core.inspect import expand_inputs, inspect_path
from dsh_core.migration.migrate import migrate
from dsh_core.jsonvalue import encode_json
from dsh_pipeline import kafka_command, otel_command, producer_commands, service_commands
from dsh_pipeline.export_command import add_export_command
from dsh_pipeline.reader_commands import add_reader_commands
from dsh_pipeline.cli_options import (add_consumer_options, add_delivery_option, add_kafka_options, add_log_options,
                                       add_ops_options, formats, host_port, positive_seconds, upstream)
from dsh_pipeline.config_file import CONFIG_ENV, CommandParser, apply_config
from dsh_pipeline.exit_codes import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE,
                                     EXIT_USAGE)
from dsh_pipeline.log_lines import log_error

__all__ = ["main"]


def _inspect(args: argparse.Namespace) -> int:
    status = EXIT_OK
    out = sys.stdout.buffer
    for given in args.paths:
        paths = expand_inputs(given)
        if not paths:
            print(f"dsh-pipeline inspect: {given}: no session files found", file=sys.stderr)
            status = EXIT_REFUSED
        for path in paths:
            try:
                report = inspect_path(path, keep_requests=args.json)
            except OSError as exc:
                print(f"dsh-pipeline inspect: {path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
                status = EXIT_REFUSED
                continue
            if not report.result.accepted:
                status = EXIT_REFUSED
            if args.json:
                out.write(encode_json(report.to_json()) + b"\n")
            else:
                out.write(report.summary().encode("utf-8", "replace") + b"\n")
            out.flush()
    return status


def _migrate(args: argparse.Namespace) -> int:
    status = EXIT_OK
    for given in args.paths:
        path = Path(given)
        try:
            print(migrate(path))
        except DshError as exc:
            print(f"dsh-pipeline migrate: {type(exc).__name__}: {exc.message}", file=sys.stderr)
            status = EXIT_REFUSED
        except OSError as exc:
            print(f"dsh-pipeline migrate: {path}: {exc.strerror or exc}", file=sys.stderr)
            status = EXIT_REFUSED
    return status


def _demo(args: argparse.Namespace) -> int:
    from dsh_pipeline.demo import DemoConfig, run_demo
    from dsh_pipeline.demo_agents import default_real_agents
    real_agents = default_real_agents() if args.real_agents is None else args.real_agents
    return run_demo(DemoConfig(sessions=args.sessions, seed=args.seed, formats=args.format, bootstrap=args.bootstrap,
                               workdir=Path(args.workdir) if args.workdir else None, keep=args.keep,
                               real_agents=real_agents, store=args.store))


def _acls(args: argparse.Namespace) -> int:
    from dsh_kafka.acls import kafka_acls_commands, pipeline_acls, service_acls
    from dsh_kafka.topics import TopicNames
    names = TopicNames.with_prefix(args.topic_prefix)
    acls = (service_acls(args.principal, args.service, names, args.group) if args.service
            else pipeline_acls(args.principal, names, args.group_prefix))
    print("\n".join(kafka_acls_commands(acls, args.bootstrap_server)))
    return EXIT_OK


#: Reads only ``--config`` (before the command's parser takes the file's defaults).
_CONFIG_ONLY = argparse.ArgumentParser(add_help=False)
_CONFIG_ONLY.add_argument("--config")


class _Cli(argparse.ArgumentParser):
    """The top-level parser, which keeps its command parsers by name."""

    commands: dict[str, CommandParser]


def build_parser() -> _Cli:
    parser = _Cli(prog="dsh-pipeline", description="Kafka pipeline for dsh agent session logs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {importlib.metadata.version('dsh-pipeline')}")
    parser.add_argument("--config", metavar="FILE", help=f"a TOML configuration file (default ${CONFIG_ENV}); "
                                                         "flags and DSH_KAFKA_* variables win over it")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    parser.commands = commands.choices
    inspect = commands.add_parser("inspect", help="read session files or directories and report them")
    inspect.add_argument("paths", nargs="+", help="session files (.jsonl, .jsonl.zstd) or directories")
    inspect.add_argument("--json", action="store_true",
                         help="one JSON object per input (the corpus expected.json fields)")
    inspect.set_defaults(run=_inspect)

    migrate = commands.add_parser("migrate", help="write a v4 log beside a dsh 0.1.x (v0) or 0.1.5 (v3) session, as "
                                                  "dsh 0.2.1 would (the source is never changed)")
    migrate.add_argument("paths", nargs="+", help="session.jsonl[.zstd] or session.v3.jsonl[.zstd] files in dsh's "
                                                  "layout, or their session folders")
    migrate.set_defaults(run=_migrate)

    kafka = commands.add_parser("kafka", help="the local Kafka broker, or a cluster of several (Maven jars, KRaft)")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    kafka.add_argument("--data-dir", help="broker data folder (default: ~/.cache/dsh-pipeline/broker, unless only "
                                          "the broker the last `kafka start --data-dir` started runs: commands "
                                          "without --bootstrap find that one too)")
    kafka.add_argument("--port", type=int, help="start: the client port on 127.0.0.1 (default: the folder's last "
                                                  "one while free, else any free port)")
    kafka.add_argument("--secure", action="store_true",
                       help="start: also serve SASL_SSL (a CA made at first start, a SCRAM user per service, ACLs "
                            "letting each do only its part) and print that address; <data>/clients/SERVICE.toml "
                            "configures each service")
    kafka.add_argument("--nodes", type=int, metavar="N",
                       help="start: a cluster of N broker-and-controller nodes on loopback (plaintext), each in "
                            "<data>/node-K; it keeps 3 copies of new topics (fewer with fewer nodes), all but one of which "
                            "must acknowledge; its bootstrap is every node's address (default: one broker)")
    kafka.set_defaults(run=kafka_command.kafka)

    ship = commands.add_parser(
        "ship", help="ship a dsh sessions root to Kafka, following new records",
        description="Ship every session log of a dsh sessions root to Kafka, then follow new records. dsh keeps "
                    "each session at ROOT/<project>/<session-id>/session[.vN].jsonl[.zstd] (the project folder "
                    "named for the session's cwd, the session folder for its id); a log anywhere else is refused "
                    "by name (LayoutError). --layout-from copies logs kept elsewhere into that layout first. "
                    "Each pass ends with a summary line (every --summary-every seconds while following); "
                    "SIGINT or SIGTERM stops within a second, the checkpoint holding every record sent. "
                    "Checkpoints are kept per destination, the Kafka cluster (by the id in its metadata) and the "
                    "events topic: the same root shipped to another cluster or topic prefix is shipped from the "
                    "start (said in one line), and the first destination's positions are kept for when it is "
                    "shipped there again. A refused file is skipped while it stays as it was (size, "
                    "modification time, inode, a digest of its bytes at the refusal and at its end); once it "
                    "changed it is read again from its checkpoint (from the start if it shrank below it or was "
                    "replaced). Following uses inotify to look only at the folders that changed, and reads the "
                    "whole root every --rescan-every seconds all the same; where inotify cannot be had or its "
                    "watch limit is reached, that is said once and each pass reads the whole root. Exit "
                    "codes: --once 0 all shipped, 1 something was refused (in this pass or an earlier one, and "
                    "unchanged since), 130 stopped before the end; following, 0 when stopped; 69 the cluster did not "
                    "acknowledge records within --delivery-timeout.")
    ship.add_argument("--root", required=True, help="dsh sessions root (DSH_SESSION_ROOT)")
    ship.add_argument("--state", help="checkpoint folder (default: ROOT/.dsh-shipper)")
    ship.add_argument("--once", action="store_true", help="ship what exists now and exit (backfill)")
    ship.add_argument("--poll", type=float, default=0.5, help="seconds between passes when following")
    ship.add_argument("--summary-every", type=float, default=60.0, metavar="SECONDS",
                      help="following: a summary line this often (default 60)")
    ship.add_argument("--rescan-every", type=positive_seconds, default=300.0, metavar="SECONDS",
                      help="following with inotify: read the whole root this often all the same, for changes "
                           "inotify does not see (another host's writes on a network file system; default 300)")
    ship.add_argument("--layout-from", nargs="+", default=[], metavar="FILE",
                      help="first copy these session logs (or every .jsonl and .jsonl.zstd file under these "
                           "folders) into ROOT where dsh keeps them, as each one's header says; an identical copy "
                           "already there is kept, another log in its place is refused")
    add_delivery_option(ship, "the checkpoint holds what was acknowledged, so a restart ships no repeat of it")
    add_ops_options(ship)
    add_kafka_options(ship)
    ship.set_defaults(run=service_commands.ship)

    worker = commands.add_parser("worker", help="run a real dsh agent runtime and publish its session live")
    worker.add_argument("--runtime", choices=("jsonrpc", "headless"), default="jsonrpc",
                        help="jsonrpc: dsh 0.1.1's JSON-RPC agent (v0 logs, from the installed runtime wheel); "
                             "headless: dsh 0.2.x's headless CLI, a process per turn (v4 logs)")
    worker.add_argument("--dsh-version", default="0.2.1rc2",
                        help="headless: the deepseek-harness-runtime-bin release to run (fetched once into the cache)")
    worker.add_argument("--session-id", help="the session to prompt (jsonrpc: required; headless: continue this "
                                             "stored session instead of starting one)")
    worker.add_argument("--prompt", action="append", required=True, help="a user prompt (repeat for more turns)")
    worker.add_argument("--workspace", default=".", help="the agent's working directory")
    worker.add_argument("--session-root", default="./sessions", help="jsonrpc: where dsh writes its session files "
                                                                     "(headless: under --home)")
    worker.add_argument("--home", default="./.dsh-home", help="DSH_HOME for the runtime")
    worker.add_argument("--model-url", help="the model endpoint (default: $DEEPSEEK_BASE_URL)")
    worker.add_argument("--model", default="deepseek-v4-flash")
    worker.add_argument("--no-gateway", action="store_true",
                        help="let the runtime call the model directly (by default its requests go through an "
                             "attesting gateway on loopback, so the auditor verifies each against the log)")
    add_delivery_option(worker, "the events acknowledged before stay published")
    add_kafka_options(worker)
    worker.set_defaults(run=producer_commands.worker)

    from consumers.archiver import ArchiverConfig
    from consumers.auditor import AuditorConfig
    from consumers.projector import ProjectorConfig

    project = commands.add_parser("project", help="keep every session's derived conversation (the view store)")
    project.add_argument("--store", default="views.sqlite",
                         help="the view store: a SQLite file (one host) or a postgresql:// URI (projectors on many "
                              "hosts); created or migrated on start")
    project.add_argument("--prices", metavar="FILE",
                         help="a price table (TOML) the cost counter dsh_cost_usd_total is counted by (default: the "
                              "packaged DeepSeek prices)")
    add_consumer_options(project, ProjectorConfig)
    project.set_defaults(run=service_commands.project)

    audit = commands.add_parser("audit", help="prove every model request rebuildable from the log; report findings")
    audit.add_argument("--state", default="auditor-state.sqlite",
                       help="the SQLite state store (committed session state; restarts replay from it)")
    audit.add_argument("--checkpoint-seconds", type=float, default=AuditorConfig.checkpoint_seconds,
                       help="how often every changed session is stored (bounds the replay after a crash)")
    audit.add_argument("--require-gateway", action="store_true",
                       help="report every request boundary of the log that no gateway attested (unattested-request)")
    audit.add_argument("--wire-deadline", type=float, default=AuditorConfig.wire_deadline_seconds, metavar="SECONDS",
                       help="how long a gateway's attestation and its request boundary may wait for each other "
                            f"(default {AuditorConfig.wire_deadline_seconds:g}), in record time")
    add_consumer_options(audit, AuditorConfig)
    audit.set_defaults(run=service_commands.audit)

    gateway = commands.add_parser("gateway", help="a model API proxy for dsh agents that attests every request "
                                                  "they send (point their DEEPSEEK_BASE_URL at it)")
    gateway.add_argument("--listen", type=host_port, default=("127.0.0.1", 8787), metavar="HOST:PORT",
                         help="where agents reach it (default 127.0.0.1:8787)")
    gateway.add_argument("--upstream", type=upstream, required=True, metavar="URL",
                         help="the model endpoint the fleet used as its DEEPSEEK_BASE_URL (http or https)")
    gateway.add_argument("--read-timeout", type=float, default=300.0, metavar="SECONDS",
                         help="the longest silence of an upstream response before it counts as stalled (default 300)")
    gateway.add_argument("--credentials-file", metavar="FILE",
                         help="the fleet's clients, NAME SECRET per line, mode 0600 (default: "
                              "$DSH_GATEWAY_CREDENTIALS_FILE); a client shows its SECRET in x-dsh-gateway-credential")
    gateway.add_argument("--upstream-key-file", metavar="FILE",
                         help="the upstream's API key, mode 0600: clients then show their SECRET as their API key "
                              "(authorization: Bearer or x-api-key, as dsh runtimes do) and the gateway sends this key")
    gateway.add_argument("--session-rate", type=float, default=10.0, metavar="PER_SECOND",
                         help="requests a second each session may send, three times that at once (default 10)")
    gateway.add_argument("--max-connections", type=int, default=1024, metavar="N",
                         help="open connections kept (default 1024); beyond them the least recently active idle one "
                              "is closed, or, when every one is busy, the new one is answered 503")
    add_ops_options(gateway)
    add_kafka_options(gateway)
    gateway.set_defaults(run=service_commands.gateway)

    serve = commands.add_parser("serve", help="the read API and the web transcript viewer over the view store")
    serve.add_argument("--store", default="views.sqlite",
                       help="the view store: a SQLite file or a postgresql:// URI (read-only)")
    serve.add_argument("--listen", type=host_port, default=("127.0.0.1", 8788), metavar="HOST:PORT",
                       help="where it answers (default 127.0.0.1:8788)")
    serve.add_argument("--tokens-file", metavar="FILE",
                       help="its bearer tokens, one per line (also $DSH_API_TOKENS, comma-separated)")
    serve.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                       help="a web origin allowed to call the API from a browser (repeatable; default: none)")
    serve.add_argument("--trusted-proxy", action="append", metavar="ADDRESS",
                       help="a reverse proxy's address whose X-Forwarded-For and X-Forwarded-Proto are believed "
                            "(the client's address for sign-in throttling, https for the cookie's Secure flag; "
                            "repeatable; default: none, every peer is taken as the client)")
    serve.add_argument("--prices", metavar="FILE",
                       help="the price table (TOML, US dollars per million tokens by model) usage is priced with "
                            "(default: the packaged DeepSeek prices; the summary names when they were taken)")
    add_ops_options(serve)
    serve.set_defaults(run=service_commands.serve)

    archive = commands.add_parser("archive", help="write every session back in dsh's layout and zstd framing")
    archive.add_argument("--root", required=True, help="the archive root (a dsh sessions root)")
    archive.add_argument("--v4-copies", action="store_true",
                         help="also write each v0 and v3 session as the v4 log dsh 0.2.1 migrates it to "
                              "(session.v4.jsonl.zstd beside the archived file, which dsh 0.2.x then reads and "
                              "continues); rewritten after each batch of the session")
    add_consumer_options(archive, ArchiverConfig)
    archive.set_defaults(run=service_commands.archive)

    otel_command.add_export_otel(commands, add_consumer_options)

    demo = commands.add_parser("demo", help="the end-to-end pipeline on a local broker, checked against ground truth")
    demo.add_argument("--sessions", type=int, default=300)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--format", type=formats, default=(0, 3, 4), metavar="V[,V...]",
                      help="the fleet's session formats, taken in turns (default 0,3,4: v0, v3 and v4 side by side)")
    demo.add_argument("--bootstrap", help="use this cluster instead of starting a local broker")
    demo.add_argument("--workdir", help="where views, archive and logs go (default: a temporary folder)")
    demo.add_argument("--keep", action="store_true", help="keep the work folder (a failed run always keeps it)")
    demo.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                      help="the view store: a SQLite file (default) or PostgreSQL (a local server from Debian's "
                           "binaries, or $DSH_POSTGRES_DSN's)")
    demo.add_argument("--real-agents", type=int, metavar="N",
                      help="also run N real dsh 0.1.1rc1 agents (JSON-RPC runtime) through a gateway in front of a "
                           "scripted model, their requests verified by the auditor (default 8 where the runtime "
                           "wheel is installed, else none; 0: none)")
    demo.set_defaults(run=_demo)

    acls = commands.add_parser("acls", help="print the kafka-acls.sh commands granting a principal what the "
                                             "pipeline needs on an authorizing cluster")
    acls.add_argument("--principal", required=True, help="e.g. User:dsh (the SASL user or TLS subject)")
    acls.add_argument("--topic-prefix", default="", help="prefix of the pipeline's topic names")
    acls.add_argument("--group-prefix", default="dsh-", help="what every --group of the services begins with "
                                                            "(default dsh-, as the default groups do)")
    acls.add_argument("--bootstrap-server", default="BROKER:9092", help="what the commands connect to")
    acls.add_argument("--service", choices=("shipper", "publisher", "projector", "auditor", "archiver"),
                      help="only what this service needs, on topics an operator created (a principal per service)")
    acls.add_argument("--group", help="with --service: its consumer group (default: the service's own)")
    acls.set_defaults(run=_acls)

    add_reader_commands(commands, add_kafka_options)
    add_export_command(commands)

    simulate = commands.add_parser("simulate", help="publish a deterministic fleet of simulated agents")
    simulate.add_argument("--sessions", type=int, default=50)
    simulate.add_argument("--seed", type=int, default=1)
    simulate.add_argument("--max-turns", type=int, default=4)
    simulate.add_argument("--format", type=formats, default=(0,), metavar="V[,V...]",
                          help="session format: 0 (dsh 0.1.x), 3 (0.1.5) or 4 (0.2.1); a comma-separated list "
                               "writes a mixed fleet, taking them in turns (default 0)")
    simulate.add_argument("--manifest", help="write the ground-truth manifest (JSON) here")
    add_delivery_option(simulate, "the manifest holds the sessions acknowledged whole, marked partial")
    add_log_options(simulate)
    for kind in ("unlogged", "dropped", "duplicate", "lossless", "unknown"):
        simulate.add_argument(f"--fault-{kind}", type=int, default=0, metavar="N", help=f"inject N {kind} defects")
    add_kafka_options(simulate)
    simulate.set_defaults(run=producer_commands.simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    config, _ = _CONFIG_ONLY.parse_known_args(argv)
    try:
        apply_config(config.config, parser.commands, os.environ)
    except DshError as exc:
        print(f"dsh-pipeline: {type(exc).__name__}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except DshError as exc:
        log_error(args.command, f"{type(exc).__name__}: {exc.message}", exc)
        # here: the commands that need no cluster load no client
        from dsh_kafka.errors import ClusterUnavailableError, DeliveryTimeoutError

        return (EXIT_UNAVAILABLE if isinstance(exc, (ClusterUnavailableError, DeliveryTimeoutError))
                else EXIT_REFUSED)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so, keep the traceback for the report
        log_error(args.command, f"internal error (a bug, please report it with the traceback above): "
                                f"{type(exc).__name__}: {exc}", exc, traceback=True)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
