"""The commands that change what the view store holds: ``dead-letters
redrive`` (records sent back to the events topic after their cause was
fixed) and ``delete-session`` (the retention and right-to-erasure path).

Redrive reads each selected dead letter whole from its topic (the store
keeps only its first bytes), strips the ``dsh-dlq-*`` headers, so the
record is again what its producer wrote, and publishes it on its key to
the events topic. The services take a record they applied before as a
duplicate, so sending one twice changes nothing; the store notes every
letter sent, and a second redrive skips those (``--again`` sends them
anyway). A letter whose value was cut to fit the dead-letter topic cannot
be sent back and is named.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
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
    from dsh_pipeline.reader_commands import reader_of, resolve_session
    from dsh_pipeline.runtime import resolve_kafka

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
    store = ViewStore(args.store)
    try:
        coordinates = {letter["id"]: _coordinates(letter, names) for letter in letters}
        before = set() if args.again else store.redriven(coordinates.values())
        chosen = [letter for letter in letters if coordinates[letter["id"]] not in before]
        kafka = resolve_kafka(args.bootstrap, "dsh-pipeline-redrive")
        sent, cut = asyncio.run(_send_back(kafka, names, [coordinates[letter["id"]] for letter in chosen]))
        store.mark_redriven(sent, int(time.time() * 1000))
    finally:
        store.close()
    print(f"dsh-pipeline dead-letters redrive: {len(sent)} sent back to {names.events}, {len(before)} sent before "
          f"(--again sends them anyway), {len(cut)} cut to fit the dead-letter topic and not sendable"
          + (": " + ", ".join(f"{t}[{p}]@{o}" for t, p, o in cut) if cut else ""))
    return EXIT_OK


def _coordinates(letter: dict[str, Any], names: Any) -> tuple[str, int, int]:
    from consumers.projector.store_reader import LETTER_ID_BASE
    partition, offset = divmod(letter["id"], LETTER_ID_BASE)
    return names.dead_letter, partition, offset


async def _send_back(kafka: Any, names: Any, letters: list[tuple[str, int, int]]
                     ) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    """Publish each letter's original record to the events topic; the letters
    sent, and those cut to fit (not sendable)."""
    from aiokafka import TopicPartition
    from dsh_kafka.clients import make_consumer, make_producer
    from dsh_kafka.config import ConsumerSettings
    sent, cut = [], []
    if not letters:
        return sent, cut
    consumer = make_consumer(kafka, ConsumerSettings(group_id=None, max_records=1))
    producer = make_producer(kafka)
    await consumer.start()
    await producer.start()
    try:
        for letter in letters:
            topic, partition, offset = letter
            where = TopicPartition(topic, partition)
            consumer.assign([where])
            consumer.seek(where, offset)
            record = await asyncio.wait_for(consumer.getone(), timeout=30)
            if record.offset != offset:
                raise PipelineError(f"dead letter {topic}[{partition}]@{offset} is gone from the topic (its retention "
                                    f"passed): nothing to send back")
            headers = [(name, value) for name, value in record.headers if not name.startswith("dsh-dlq-")]
            if any(name == "dsh-dlq-value-size" for name, _ in record.headers):
                cut.append(letter)
                continue
            await producer.send(names.events, record.value, key=record.key, headers=headers)
            sent.append(letter)
        await producer.flush()
    finally:
        await producer.stop()
        await consumer.stop()
    return sent, cut


def delete_sessions(args: argparse.Namespace) -> int:
    from consumers.archiver.files import archive_segment
    from consumers.projector.reader import SessionFilter
    from consumers.projector.store import ViewStore
    from dsh_pipeline.reader_commands import reader_of, resolve_session

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
    store = ViewStore(args.store)
    folders = 0
    try:
        for session_id in dict.fromkeys(chosen):
            store.delete_session(session_id)
            if args.archive is not None:
                folders += _remove_archive(Path(args.archive), archive_segment(session_id))
    finally:
        store.close()
    print(f"dsh-pipeline delete-session: deleted {len(set(chosen))} sessions"
          + (f" and {folders} archive folders" if args.archive is not None else ""))
    return EXIT_OK


def _remove_archive(root: Path, segment: str) -> int:
    """Remove the session's folder from every project folder of the archive."""
    if not root.is_dir():
        raise PipelineError(f"{root}: no archive there (the archiver's --root)")
    removed = 0
    for project in root.iterdir():
        folder = project / segment
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
            removed += 1
    return removed
