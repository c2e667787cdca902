"""The commands that change what the view store holds: ``dead-letters
redrive`` (records sent back to the events topic after their cause was
fixed) and ``delete-session`` (the retention and right-to-erasure path).

Deletion is a fence: ``delete-session`` publishes a ``deletion`` record on
each session's key, after every record of it, then removes its rows from
the store (noting it deleted) and its archive folders. Each service, where
it reads the fence, forgets the session (memory, its state, the archive
file) and notes it deleted in its own state, so across restarts a later
record of the session is refused by name: a ``deleted-session`` dead letter
that names the record but carries none of its value. A deleted session
never comes back, half-formed or whole (its id stays taken).

Redrive sends each selected record back once, however many services and
consumer groups dead-lettered it: a letter is identified by where its
record was first read (topic, partition, offset) and its reason. It reads
one letter of the record whole from its topic (the store keeps only its
first bytes), strips the ``dsh-dlq-*`` headers, so the record is again
what its producer wrote, adds where it was first read and why it was
refused (``dsh-redrive-*``, signed with the redrive key:
:mod:`consumers.runtime.redrive_mark`), and publishes it on its key to the
events topic. The services take a record they applied before as a duplicate, so
sending one twice changes nothing; a service that refuses it again for a
reason it was dead-lettered for writes no new letter (the old one
stands), and one that refuses it for a new reason writes a letter under
the first coordinates. The store notes every record sent, and a second
redrive skips those (``--again`` sends them anyway): run from cron, it
neither repeats records nor multiplies letters. A letter whose value was
cut to fit the dead-letter topic cannot be sent back and is named.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh_core.errors import PipelineError
from dsh_pipeline.exit_codes import EXIT_OK

__all__ = ["delete_sessions", "redrive"]

_DURATION_UNITS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000}


def duration_ms(text: str) -> int:
    """``30d``, ``12h`` or ``90m`` in milliseconds (an argparse type)."""
    unit = _DURATION_UNITS.get(text[-1:])
    if unit is None or not text[:-1].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30d, 12h or 90m")
    return int(text[:-1]) * unit


def redrive(args: argparse.Namespace) -> int:
    from consumers.projector.reader import DeadLetterFilter
    from consumers.projector.store import ViewStore
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.view_access import reader_of, resolve_session
    from dsh_pipeline.runtime import resolve_kafka
    from dsh_pipeline.service_commands import redrive_key
    from consumers.runtime.redrive_mark import REDRIVE_KEY_ENV

    key = redrive_key()
    if key is None:
        raise PipelineError(f"dead-letters --redrive: ${REDRIVE_KEY_ENV} is not set: the services believe a record "
                            f"sent back only with a mark signed by the key they were started with (give the same "
                            f"file here; see docs/howto/dead-letters.md)")
    with reader_of(args.store) as reader:
        session = resolve_session(reader, args.session) if args.session else None
        where = DeadLetterFilter(service=args.service, reason=args.reason, session_id=session)
        letters, cursor = [], None
        while True:
            page = reader.dead_letters(where, cursor, limit=500)
            letters += page["items"]
            if (cursor := page["next"]) is None:
                break
    names = TopicNames.with_prefix(args.topic_prefix)
    records: dict[tuple[str, int, int], _Redriven] = {}
    for letter in letters:  # the first letter of each record (and every reason it was refused for)
        source = _source(letter, names)
        found = records.setdefault(source, _Redriven(source, _letter_coordinates(letter, names)))
        found.reasons.add(letter["reason"])
    store = ViewStore(args.store)
    try:
        before = set() if args.again else store.redriven(records)
        kafka = resolve_kafka(args.bootstrap, "dsh-pipeline-redrive")
        sent, cut = asyncio.run(_send_back(kafka, key, names, [found for source, found in records.items()
                                                          if source not in before]))
        store.mark_redriven([found.source for found in sent], int(time.time() * 1000))
    finally:
        store.close()
    print(f"dsh-pipeline dead-letters redrive: {len(sent)} sent back to {names.events}, {len(before)} sent before "
          f"(--again sends them anyway), {len(cut)} cut to fit the dead-letter topic and not sendable"
          + (": " + ", ".join(f"{t}[{p}]@{o}" for t, p, o in (found.letter for found in cut)) if cut else ""))
    return EXIT_OK


@dataclass
class _Redriven:
    """A dead-lettered record to send back: where it was first read, the
    letter its bytes are read from, and the reasons it was refused for."""

    source: tuple[str, int, int]
    letter: tuple[str, int, int]
    reasons: set[str] = field(default_factory=set)


def _letter_coordinates(letter: dict[str, Any], names: Any) -> tuple[str, int, int]:
    """Where a letter is on the dead-letter topic."""
    from consumers.projector.store_reader import LETTER_ID_BASE
    partition, offset = divmod(letter["id"], LETTER_ID_BASE)
    return names.dead_letter, partition, offset


def _source(letter: dict[str, Any], names: Any) -> tuple[str, int, int]:
    """Where a letter's record was first read (a letter that does not say
    stands for itself)."""
    source = (letter["topic"], letter["partition"], letter["offset"])
    return source if None not in source else _letter_coordinates(letter, names)


async def _send_back(kafka: Any, key: Any, names: Any, records: list[_Redriven]
                     ) -> tuple[list[_Redriven], list[_Redriven]]:
    """Publish each record, read from its letter, to the events topic with
    its mark signed by ``key``; the records sent, and those whose letter was
    cut to fit (not sendable)."""
    from aiokafka import TopicPartition
    from consumers.runtime.redrive_mark import redrive_headers
    from dsh_kafka.clients import make_consumer, make_producer
    from dsh_kafka.config import ConsumerSettings
    sent: list[_Redriven] = []
    cut: list[_Redriven] = []
    if not records:
        return sent, cut
    consumer = make_consumer(kafka, ConsumerSettings(group_id=None, max_records=1))
    producer = make_producer(kafka)
    await consumer.start()
    await producer.start()
    try:
        for found in records:
            topic, partition, offset = found.letter
            where = TopicPartition(topic, partition)
            consumer.assign([where])
            consumer.seek(where, offset)
            record = await asyncio.wait_for(consumer.getone(), timeout=30)
            if record.offset != offset:
                raise PipelineError(f"dead letter {topic}[{partition}]@{offset} is gone from the topic (its retention "
                                    f"passed): nothing to send back")
            if any(name == "dsh-dlq-value-size" for name, _ in record.headers):
                cut.append(found)
                continue
            headers = [(name, value) for name, value in record.headers if not name.startswith("dsh-dlq-")]
            await producer.send(names.events, record.value, key=record.key, headers=redrive_headers(
                key, record.key, record.value, headers, found.source, found.reasons))
            sent.append(found)
        await producer.flush()
    finally:
        await producer.stop()
        await consumer.stop()
    return sent, cut


def delete_sessions(args: argparse.Namespace) -> int:
    from consumers.archiver.files import remove_session
    from consumers.projector.reader import SessionFilter
    from consumers.projector.store import ViewStore
    from dsh_kafka.topics import TopicNames
    from dsh_pipeline.view_access import reader_of, resolve_session
    from dsh_pipeline.runtime import resolve_kafka

    with reader_of(args.store) as reader:
        chosen = [resolve_session(reader, given) for given in args.session_ids]
        if args.inactive_for is not None:
            cutoff = int(time.time() * 1000) - args.inactive_for
            cursor = None
            while True:
                page = reader.sessions(SessionFilter(active_to=cutoff), cursor, limit=500)
                chosen += [item["sessionId"] for item in page["items"]]
                if (cursor := page["next"]) is None:
                    break
    if not chosen:
        print("dsh-pipeline delete-session: no session to delete", file=sys.stderr)
        return EXIT_OK
    chosen = list(dict.fromkeys(chosen))
    if args.archive is not None and not Path(args.archive).is_dir():
        raise PipelineError(f"{args.archive}: no archive there (the archiver's --root)")
    at = int(time.time() * 1000)
    asyncio.run(_fence(resolve_kafka(args.bootstrap, "dsh-pipeline-delete-session"),
                       TopicNames.with_prefix(args.topic_prefix), chosen, at))
    store = ViewStore(args.store)
    folders = 0
    try:
        for session_id in chosen:
            store.delete_session(session_id, at)
            if args.archive is not None:
                folders += remove_session(Path(args.archive), session_id)
    finally:
        store.close()
    print(f"dsh-pipeline delete-session: deleted {len(chosen)} sessions"
          + (f" and {folders} archive folders" if args.archive is not None else ""))
    return EXIT_OK


async def _fence(kafka: Any, names: Any, session_ids: list[str], at: int) -> None:
    """Publish each session's deletion record after its records on the
    events topic (which must exist: a wrong prefix would fence nothing):
    every service forgets the session there, and takes none of its later
    records."""
    from dsh_kafka.clients import make_admin, make_producer
    from dsh_kafka.records import deletion_record
    admin = make_admin(kafka)
    await admin.start()
    try:
        listed = await admin.list_topics()
    finally:
        await admin.close()
    if names.events not in listed:
        raise PipelineError(f"no topic {names.events} on the cluster (is --topic-prefix right?): nothing was deleted")
    producer = make_producer(kafka)
    await producer.start()
    try:
        for session_id in session_ids:
            record = deletion_record(session_id, at)
            await producer.send(names.events, record.value, key=record.key, headers=record.headers)
        await producer.flush()
    finally:
        await producer.stop()
