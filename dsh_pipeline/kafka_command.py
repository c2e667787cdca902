"""``dsh-pipeline kafka``: start, stop or report the local Kafka broker (one
node, plain or ``--secure``) or a local cluster of several (``--nodes``);
the other commands find the one that runs (:mod:`dsh_pipeline.runtime`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsh_core.errors import PipelineError
from dsh_pipeline.exit_codes import EXIT_OK, EXIT_REFUSED

__all__ = ["kafka"]


def kafka(args: argparse.Namespace) -> int:
    """``kafka start|stop|status``: the local broker, or a cluster of several."""
    from dsh_pipeline.local_cluster import LocalCluster, cluster_nodes, stop_detached_cluster
    from dsh_pipeline.local_kafka import LocalKafka, probe_metadata, read_state, stop_detached
    from dsh_pipeline.runtime import local_broker, remember_broker_dir
    if args.data_dir:
        data_dir = Path(args.data_dir)
        state = read_state(data_dir)
        if state is not None and not probe_metadata(state.client()):
            state = None
    else:
        data_dir, state = local_broker()  # state: the broker that answers, else None
    nodes = cluster_nodes(data_dir)
    if args.action == "start":
        size = len(nodes) if nodes is not None else args.nodes  # None: a single broker
        if args.nodes is not None and (args.secure or args.port):
            raise PipelineError("--nodes starts a plaintext cluster on ports of its own: it takes no --secure or --port")
        if args.nodes is not None and size != args.nodes:
            raise PipelineError(f"{data_dir} holds a cluster of {size} nodes, not {args.nodes}: give another --data-dir")
        if args.data_dir:  # every other command finds it there while it runs
            remember_broker_dir(data_dir)
        if size is not None:  # a cluster folder: LocalCluster refuses a single broker's folder by name
            print(state.bootstrap if state is not None else LocalCluster(size, data_dir, attached=False).start())
            return EXIT_OK
        if state is not None:
            if args.secure and not state.secured_bootstrap:
                raise PipelineError(f"the broker of {data_dir} runs without --secure: stop it first")
            print(state.secured_bootstrap if args.secure else state.bootstrap)
            return EXIT_OK
        if args.secure:
            from dsh_pipeline.secure_broker import USERS, SecureBroker
            secure = SecureBroker(data_dir, attached=False, port=args.port)
            print(secure.start())
            print(f"SASL_SSL only, with a user per service; each service's configuration: dsh-pipeline --config "
                  f"{secure.clients}/{{{','.join(USERS)}}}.toml COMMAND ...", file=sys.stderr)
            return EXIT_OK
        if (data_dir / "secrets").is_dir():  # a plaintext listener would hand its topics to anyone
            raise PipelineError(f"the broker of {data_dir} was started with --secure: start it with --secure again")
        broker = LocalKafka(data_dir, attached=False, port=args.port)
        print(broker.start())
        return EXIT_OK
    if args.action == "stop":
        stopped = stop_detached_cluster(data_dir) if nodes is not None else stop_detached(data_dir)
        print("stopped" if stopped else "no broker was running")
        return EXIT_OK
    if state is not None:
        if nodes is not None:
            print(f"running {len(nodes)} nodes at {state.bootstrap} (data {state.data_dir}, logs "
                  f"{state.data_dir}/node-N/broker.log)")
            return EXIT_OK
        print(f"running pid {state.pid} at {state.bootstrap} (data {state.data_dir}, log {state.log})")
        return EXIT_OK
    print("not running")
    return EXIT_REFUSED
