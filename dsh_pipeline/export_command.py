"""``dsh-pipeline export``: selected sessions of the view store as a file
other tools read, JSON Lines or Parquet.

Two tables: ``sessions`` (one row per session: status, folder, times,
counts, tokens by kind and their cost by the price table) and ``messages``
(one row per derived message, dsh's own, with the seq of the event it comes
from). The sessions are those the ``sessions`` command's filters select,
or ``--session`` ids; every page of them is read and written in turn, so a
file of any number of sessions is written in bounded memory (a session's
messages are read whole). The file is written beside ``--out`` under a
new name no one else can have planted (created exclusively, readable by its
owner only, never through a link), and put in place once complete: renamed
over ``--out`` with ``--force``, else linked to it, which refuses an
``--out`` that exists, even one that appeared while the rows were written.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from dsh_core.errors import PipelineError
from dsh_pipeline.exit_codes import EXIT_OK

__all__ = ["add_export_command"]

_PAGE = 200  # sessions read at a time
_ROW_GROUP = 1000  # rows a Parquet row group holds
_TOKENS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
#: Each table's columns and their Parquet types (JSON Lines: the same keys).
_COLUMNS = {
    "sessions": {"sessionId": "string", "status": "string", "cwd": "string", "createdAt": "int64",
                 "lastActivity": "int64", "turnCount": "int64", "messageCount": "int64", "findingCount": "int64",
                 "models": "string", **dict.fromkeys(_TOKENS, "int64"), "costUsd": "float64"},
    "messages": {"sessionId": "string", "seq": "int64", "messageId": "string", "role": "string", "kind": "string",
                 "content": "string"},
}


def add_export_command(commands: Any) -> None:
    """The ``export`` subcommand on ``commands`` (argparse subparsers)."""
    from dsh_pipeline.reader_commands import STORE_HELP, add_session_filters
    export = commands.add_parser("export", help="selected sessions of the view store as JSON Lines or Parquet")
    export.add_argument("--store", default="views.sqlite", help=STORE_HELP)
    export.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    export.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl",
                        help="jsonl: one JSON object per line (default); parquet: Apache Parquet (pyarrow)")
    export.add_argument("--table", choices=("sessions", "messages"), default="sessions",
                        help="sessions: one row per session, tokens and cost (default); messages: one row per "
                             "derived message, with its session and seq")
    export.add_argument("--session", action="append", metavar="ID", help="this session (repeatable; id or prefix)")
    export.add_argument("--prices", metavar="FILE", help="the price table costs come from (default: the packaged one)")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_session_filters(export)
    export.set_defaults(run=_export)


def _export(args: argparse.Namespace) -> int:
    from dsh_pipeline.prices import load_prices
    from dsh_pipeline.reader_commands import session_filter
    from dsh_pipeline.view_access import reader_of, resolve_session

    out = Path(args.out)
    if out.exists() and not args.force:
        raise PipelineError(f"--out {out}: exists; give --force to replace it")
    write = _writer(args.format)  # a missing pyarrow is said before the store is read
    prices = load_prices(args.prices)
    where = session_filter(args)
    with reader_of(args.store) as reader:
        chosen = [resolve_session(reader, given) for given in args.session or ()]
        sessions = _chosen(reader, chosen) if chosen else _selected(reader, where)
        rows = _session_rows(sessions, prices) if args.table == "sessions" else _message_rows(reader, sessions)
        count = write(out, args.table, rows, args.force)
    print(f"dsh-pipeline export: {count} {args.table} rows written to {out}", file=sys.stderr)
    return EXIT_OK


def _selected(reader: Any, where: Any) -> Iterator[dict[str, Any]]:
    cursor = None
    while True:
        page = reader.sessions(where, cursor, _PAGE)
        yield from page["items"]
        if (cursor := page["next"]) is None:
            return


def _chosen(reader: Any, session_ids: list[str]) -> Iterator[dict[str, Any]]:
    from consumers.projector.reader import SessionFilter
    wanted = set(session_ids)
    for session in _selected(reader, SessionFilter()):
        if session["sessionId"] in wanted:
            yield session


def _session_rows(sessions: Iterator[dict[str, Any]], prices: Any) -> Iterator[dict[str, Any]]:
    for session in sessions:
        models = session.get("models") or []
        costs = [prices.cost(model.get("provider"), model.get("model"), model) for model in models]
        yield {"sessionId": session["sessionId"], "status": session["status"], "cwd": _text(session.get("cwd")),
               "createdAt": _int64(session.get("createdAt")), "lastActivity": _int64(session.get("lastActivity")),
               "turnCount": session.get("turnCount"), "messageCount": session.get("messageCount"),
               "findingCount": session.get("findingCount"),
               "models": ",".join(sorted({str(model.get("model")) for model in models})),
               **{column: sum(_int64(model.get(column)) or 0 for model in models) for column in _TOKENS},
               "costUsd": None if None in costs else round(sum(costs), 6)}  # unpriced: unknown, not free


def _message_rows(reader: Any, sessions: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for listed in sessions:
        session = reader.session(listed["sessionId"])
        if session is None:  # deleted since it was listed
            continue
        for message in session["messages"]:
            source = message.get("source") if isinstance(message.get("source"), dict) else {}
            yield {"sessionId": session["sessionId"], "seq": session["messageSeqs"].get(message.get("id")),
                   "messageId": _text(message.get("id")), "role": _text(message.get("role")),
                   "kind": _text(source.get("kind")), "content": _json_text(message.get("content"))}


def _int64(value: Any) -> int | None:
    """A count or time a Parquet int64 holds; ``None`` for anything else (a log's odd value)."""
    if isinstance(value, int) and not isinstance(value, bool) and -2 ** 63 <= value < 2 ** 63:
        return value
    return None


def _text(value: Any) -> str | None:
    """A text as UTF-8 holds it (a lone surrogate, which dsh keeps, as its ``\\u`` escape)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_text(value: Any) -> str:
    """``value`` as JSON text, readable where it can be, ``\\u``-escaped where UTF-8 cannot hold it."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True)


def _writer(kind: str) -> Callable[[Path, str, Iterator[dict[str, Any]], bool], int]:
    if kind == "jsonl":
        return _write_jsonl
    if importlib.util.find_spec("pyarrow") is None:
        raise PipelineError("--format parquet needs pyarrow: pip install 'dsh-pipeline[export]'")
    return _write_parquet


def _staged(out: Path, force: bool, write: Callable[[BinaryIO], int]) -> int:
    """``write`` a new owner-only file beside ``out`` (a name made with
    ``O_EXCL``: nothing planted there is opened or followed), then put it in
    place: renamed over ``out`` when ``force``, else linked as ``out``,
    which fails if ``out`` exists by then."""
    try:
        descriptor, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    except OSError as error:
        raise PipelineError(f"--out {out}: cannot be written: {error.strerror or error}") from None
    staged = Path(name)
    try:
        with open(descriptor, "wb") as stream:
            count = write(stream)
        if force:
            os.replace(staged, out)
        else:
            os.link(staged, out)
        return count
    except FileExistsError:
        raise PipelineError(f"--out {out}: exists; give --force to replace it") from None
    except OSError as error:
        raise PipelineError(f"--out {out}: cannot be written: {error.strerror or error}") from None
    finally:
        staged.unlink(missing_ok=True)


def _write_jsonl(out: Path, table: str, rows: Iterator[dict[str, Any]], force: bool) -> int:
    def write(stream: BinaryIO) -> int:
        count = 0
        for row in rows:
            stream.write((_json_text(row) + "\n").encode("utf-8"))  # UTF-8 holds it (see _json_text)
            count += 1
        return count
    return _staged(out, force, write)


def _write_parquet(out: Path, table: str, rows: Iterator[dict[str, Any]], force: bool) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in _COLUMNS[table].items()])

    def write(stream: BinaryIO) -> int:
        count = 0
        with pq.ParquetWriter(stream, schema) as writer:
            while batch := list(itertools.islice(rows, _ROW_GROUP)):
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
        return count
    return _staged(out, force, write)
