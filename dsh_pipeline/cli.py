"""``dsh-pipeline``: the command line (composition root of the project)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from dsh_core.errors import DshError
from dsh_core.inspect import expand_inputs, inspect_path
from dsh_core.jsonvalue import encode_json

__all__ = ["main"]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsh-pipeline", description="Kafka pipeline for dsh agent session logs.")
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="read session files or directories and report them")
    inspect.add_argument("paths", nargs="+", help="session files (.jsonl, .jsonl.zstd) or directories")
    inspect.add_argument("--json", action="store_true",
                         help="one JSON object per input (the corpus expected.json fields)")
    inspect.set_defaults(run=_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except DshError as exc:
        print(f"dsh-pipeline {args.command}: {type(exc).__name__}: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
