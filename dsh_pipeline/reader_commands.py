"""The commands on the view store: ``sessions``, ``view``, ``findings`` and
``dead-letters`` read it (an existing store, ``--store``: a SQLite file or
a ``postgresql://`` URI, opened read-only); ``dead-letters --redrive`` and
``delete-session`` (:mod:`dsh_pipeline.store_commands`) change it."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

from dsh_core.jsonvalue import encode_json
from dsh_pipeline import store_commands
from dsh_pipeline.view_access import reader_of, resolve_session
from dsh_pipeline.exit_codes import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from dsh_pipeline.transcript import format_time, visible

__all__ = ["STORE_HELP", "add_reader_commands", "add_session_filters", "session_filter"]

#: How often ``findings --follow`` asks the store.
_FOLLOW_SECONDS = 1.0
STORE_HELP = "the view store: a SQLite file or a postgresql:// URI (default: views.sqlite)"


def add_reader_commands(commands: Any, add_kafka_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """The view store's subcommands on ``commands`` (argparse subparsers)."""
    from dsh_pipeline.store_commands import duration_ms
    sessions = commands.add_parser("sessions", help="list the sessions in the view store, most recently active first")
    add_session_filters(sessions)
    _page_options(sessions)
    sessions.set_defaults(run=_sessions)

    view = commands.add_parser("view", help="print a session's conversation from the view store")
    view.add_argument("session_id", help="the session's id, or a prefix of it that names one session")
    view.add_argument("--store", default="views.sqlite", help=STORE_HELP)
    view.add_argument("--json", action="store_true", help="the derived messages as JSON (identical to dsh's)")
    view.set_defaults(run=_view)

    findings = commands.add_parser("findings", help="the auditor's findings, newest first")
    findings.add_argument("--rule", help="only this rule (e.g. request-mismatch)")
    findings.add_argument("--severity", choices=("error", "warning"))
    findings.add_argument("--session", help="only this session (id or unique prefix)")
    findings.add_argument("--follow", action="store_true",
                          help="then print each new finding as the store indexes it, until interrupted")
    _page_options(findings)
    findings.set_defaults(run=_findings)

    letters = commands.add_parser("dead-letters", help="records a service could not take, newest first; --show one; "
                                                       "--redrive the selection back to the events topic")
    letters.add_argument("--show", type=int, metavar="ID", help="this dead letter (its id from the list)")
    letters.add_argument("--service", choices=("projector", "auditor", "archiver"))
    letters.add_argument("--reason", help="only this reason (invalid-log, corrupt-storage, ...)")
    letters.add_argument("--session", help="only this session (id or unique prefix)")
    letters.add_argument("--redrive", action="store_true",
                         help="send every selected dead letter back to the events topic (after its cause was fixed); "
                              "each once, unless --again")
    letters.add_argument("--again", action="store_true", help="with --redrive: also letters sent back before")
    _page_options(letters)
    add_kafka_options(letters)
    letters.set_defaults(run=_dead_letters)

    delete = commands.add_parser("delete-session", help="remove sessions' views, findings, dead letters and archive "
                                                        "files (retention and erasure); the services forget them and "
                                                        "refuse their later records (deleted-session)")
    delete.add_argument("session_ids", nargs="*", metavar="ID-OR-PREFIX", help="these sessions")
    delete.add_argument("--inactive-for", type=duration_ms, metavar="AGE",
                        help="and every session with no activity for AGE (30d, 12h, 90m): the retention setting")
    delete.add_argument("--archive", help="the archiver's --root: remove the sessions' archive folders too")
    delete.add_argument("--store", default="views.sqlite", help=STORE_HELP)
    add_kafka_options(delete)  # the deletion goes on the events topic: the services forget the sessions there
    delete.set_defaults(run=store_commands.delete_sessions)


def add_session_filters(parser: argparse.ArgumentParser) -> None:
    """The options that select sessions (:func:`session_filter` reads them)."""
    from consumers.projector.reader import STATUSES
    parser.add_argument("--status", action="append", choices=STATUSES, help="only this status (repeatable)")
    for flag, meaning in (("--provider", "used this provider"), ("--model", "used this model"),
                          ("--cwd", "its working directory starts with this"),
                          ("--text", "a current message contains this (case-insensitive)")):
        parser.add_argument(flag, help=meaning)
    parser.add_argument("--findings", dest="has_findings", action=argparse.BooleanOptionalAction,
                        help="only sessions the audit found something in (--no-findings: nothing)")


def session_filter(args: argparse.Namespace) -> Any:
    """The :class:`~consumers.projector.reader.SessionFilter` of :func:`add_session_filters`' options."""
    from consumers.projector.reader import SessionFilter
    return SessionFilter(status=tuple(args.status) if args.status else None, provider=args.provider,
                         model=args.model, cwd=args.cwd, has_findings=args.has_findings, text=args.text)


def _page_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default="views.sqlite", help=STORE_HELP)
    parser.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def _sessions(args: argparse.Namespace) -> int:
    with reader_of(args.store) as reader:
        items = reader.sessions(session_filter(args), limit=args.limit)["items"]
    if args.json:
        for item in items:
            sys.stdout.buffer.write(encode_json(item) + b"\n")
        return EXIT_OK
    rows = [(visible(item["sessionId"]), visible(item["status"]), format_time(item["lastActivity"]),
             str(item["turnCount"]), str(item["messageCount"]), str(item["findingCount"]),
             visible(",".join(sorted({str(usage["model"]) for usage in item["models"]})) or "-"),
             visible(item["cwd"] or "")) for item in items]
    if rows:
        width = max(len(row[0]) for row in rows)
        for row in [_SESSION_COLUMNS, *rows]:
            print(f"{row[0]:<{width}}  {row[1]:<7}  {row[2]:<23}  {row[3]:>5}  {row[4]:>5}  {row[5]:>8}  {row[6]}  "
                  f"{row[7]}".rstrip())
    return EXIT_OK


#: The header row of ``sessions``.
_SESSION_COLUMNS = ("SESSION", "STATUS", "LAST ACTIVITY", "TURNS", "MSGS", "FINDINGS", "MODELS", "CWD")


def _view(args: argparse.Namespace) -> int:
    from dsh_pipeline.transcript import transcript_lines
    with reader_of(args.store) as reader:
        session = reader.session(resolve_session(reader, args.session_id))
    messages = session["messages"]
    if args.json:
        sys.stdout.buffer.write(encode_json(messages) + b"\n")
        return EXIT_OK
    print(f"session {visible(session['sessionId'])}: {visible(session['status'])}, next seq {session['nextSeq']}, "
          f"{session['turnCount']} turns, {len(messages)} messages"
          + (f", {visible(session['error'])}" if session.get("error") else ""))
    for line in transcript_lines(messages):
        print(line)
    return EXIT_OK


def _findings(args: argparse.Namespace) -> int:
    from consumers.projector.reader import FindingFilter
    with reader_of(args.store) as reader:
        session = resolve_session(reader, args.session) if args.session else None
        where = FindingFilter(rule=args.rule, severity=args.severity, session_id=session)
        items = reader.findings(where, limit=args.limit)["items"]
        _print_findings(items, args.json)
        seen = {item["id"] for item in _unseen(reader, where, set())} if args.follow else set()
        while args.follow:  # until interrupted: every new finding once, oldest first
            time.sleep(_FOLLOW_SECONDS)  # wait-ok: polling the store for what it indexes next
            fresh = _unseen(reader, where, seen)
            _print_findings(fresh[::-1], args.json)
            seen.update(item["id"] for item in fresh)
    return EXIT_OK


def _unseen(reader: Any, where: Any, seen: set[str]) -> list[dict[str, Any]]:
    """The matching findings not in ``seen``, newest first (every page is
    read: a finding indexed late may be older than one seen)."""
    fresh, cursor = [], None
    while True:
        page = reader.findings(where, cursor, limit=500)
        fresh += [item for item in page["items"] if item["id"] not in seen]
        if (cursor := page["next"]) is None:
            return fresh


def _print_findings(items: list[dict[str, Any]], as_json: bool) -> None:
    for item in items:
        if as_json:
            sys.stdout.buffer.write(encode_json(item) + b"\n")
        else:
            print(f"{format_time(item['at'])}  {visible(item['severity']):<7} {visible(item['rule'])}  "
                  f"{_where(item, 'seq', 'turn', 'step')}: {visible(item['detail'])}")
    sys.stdout.flush()


def _dead_letters(args: argparse.Namespace) -> int:
    from consumers.projector.reader import DeadLetterFilter
    if args.redrive:
        return store_commands.redrive(args)
    if args.again:
        print("dsh-pipeline dead-letters: --again goes with --redrive (it sends back records sent before); without "
              "--redrive nothing is sent", file=sys.stderr)
        return EXIT_USAGE
    with reader_of(args.store) as reader:
        if args.show is not None:
            letter = reader.dead_letter(args.show)
            if letter is None:
                print(f"dsh-pipeline dead-letters: no dead letter {args.show} in {reader.where}", file=sys.stderr)
                return EXIT_REFUSED
            items = [letter]
        else:
            session = resolve_session(reader, args.session) if args.session else None
            items = reader.dead_letters(DeadLetterFilter(service=args.service, reason=args.reason,
                                                         session_id=session), limit=args.limit)["items"]
    for item in items:
        if args.json or args.show is not None:
            sys.stdout.buffer.write(encode_json(item) + b"\n")
        else:
            print(f"{item['id']}  {format_time(item['at'])}  {visible(item['service']):<9} {visible(item['reason'])}  "
                  f"{visible(item['topic'])}[{item['partition']}]@{item['offset']}  {_where(item, 'seq')}: "
                  f"{visible(item['detail'])}" + (f" ({item['copies']} letters)" if item["copies"] > 1 else ""))
    return EXIT_OK


def _where(item: dict[str, Any], *fields: str) -> str:
    """``session ID seq 4 turn 2 step 1``: what of it the item knows."""
    known = [("session", item["sessionId"]), *((field, item[field]) for field in fields)]
    return " ".join(f"{name} {visible(value)}" for name, value in known if value is not None)


