"""A seeded mutation fuzzer over the readers and the three services' record paths.

Its inputs are real logs (the conformance corpus, the v3/v4 fixtures dsh
wrote, simulated v0/v3/v4 sessions), each mutated one to three times: a
byte changed, a JSON value replaced by one of another type (or nested at
the depth limit, or past it), a key dropped, an event's type or payload
swapped for another's, lines dropped, repeated, swapped, joined, or taken
from another session. Each input is a log file for the reader (the
conformance JSON of ``inspect``, analysis included) and the records a
shipper would publish of it, fed to an auditor, an archiver (with v4
copies) and a projector per view-store backend asked for (each writing its
own store; the findings and dead letters go through the outcome index into
each store), as the runtime does, without a broker. Services stay open
over a chunk of inputs, and the records of several inputs (each its own
session) share a poll batch, as a busy partition's do: one checkpoint, one
store transaction per batch.

The only outcomes allowed: a log accepted or refused with a
:class:`~dsh_core.errors.DshError`; records applied, held, duplicates or
dead-lettered with a named reason (never ``internal``). Anything else is a
:class:`Crash`; a batch that crashes is fed again one input at a time to
fresh services, and the crash names the seed and the input that does it,
which is kept in the found inputs (:data:`CORPUS`, run by the test tiers
as regression cases). ``python -m tests.fuzzing SEED INDEX OUT`` writes an
input to a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import sys
import tempfile
import typing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from aiokafka import TopicPartition

from consumers.archiver import Archive, ArchiverConfig
from consumers.auditor import Audit, AuditorConfig
from consumers.projector import Projection, ProjectorConfig
from consumers.projector.outcomes import finding_row, letter_row
from consumers.runtime import ConsumerService, Policy
from consumers.runtime.store_backends import BACKENDS, backend_of
from dsh_core.analysis import LogAnalysis
from dsh_core.errors import Category, DshError
from dsh_core.inspect import error_json
from dsh_core.loader import load_session_bytes
from dsh_kafka.records import KIND_HEADER, KIND_RECORD, SessionRecord, record_from_line
from tests.fuzz_inputs import mutated, source_of
from tests.policy_driver import KAFKA, NAMES, Fetched, RecordingOutputs
from tests.store_locations import discard_location, new_location

__all__ = ["CORPUS", "Crash", "Fuzzer", "check_log", "found_inputs", "open_services"]

#: The inputs the fuzzer found (kept as regression cases; a crash adds its input).
CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
NAMED = frozenset(typing.get_args(Category)) - {"internal"}
#: The view-store backends by name (a name crosses to the worker processes).
_BACKENDS = {backend.name: backend for backend in BACKENDS}


class Crash(AssertionError):
    """An input that made a reader or a service fail other than by name."""


def found_inputs() -> list[Path]:
    """The inputs kept in :data:`CORPUS`, by name."""
    return sorted(CORPUS.glob("*.jsonl"))


@contextlib.contextmanager
def _quiet() -> typing.Iterator[None]:
    """The services log a line per refusal and batch: thousands here."""
    logger = logging.getLogger("dsh")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        yield
    finally:
        logger.setLevel(level)


# ------------------------------------------------------------------- checks


def _records(lines: list[bytes], tag: str = "") -> list[SessionRecord]:
    """The records a shipper would publish of the lines: a line that is no
    record is kept as one event at the next seq (a hostile writer's). With
    a ``tag``, the session's id (where the lines spell it plainly) ends in it."""
    try:
        header = json.loads(lines[0])
        session_id, version = header["id"], header.get("version", 0)
        session_id.encode()  # a record key is UTF-8
        version = version if version in (0, 3, 4) else 0
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, UnicodeEncodeError):
        session_id, version = "fuzzed", 0
    session_id = session_id or "fuzzed"
    if tag:
        spelled = json.dumps(session_id, ensure_ascii=False).encode("utf-8", "surrogatepass")
        session_id += tag
        retagged = json.dumps(session_id, ensure_ascii=False).encode("utf-8", "surrogatepass")
        lines = [line.replace(spelled, retagged) for line in lines]
    records, next_seq = [SessionRecord(session_id, KIND_HEADER, 0, 0, lines[0], version)], 0
    for line in lines[1:]:
        try:
            record = record_from_line(session_id, line, version)
        except DshError:
            record = SessionRecord(session_id, KIND_RECORD, next_seq, 1, line, version)
        if not (0 <= record.seq < 2**53 and 0 < record.count < 2**53):
            record = SessionRecord(session_id, KIND_RECORD, next_seq, 1, line, version)
        next_seq = record.seq + record.count
        records.append(record)
    return records


def check_reader(data: bytes, source: str) -> None:
    """Load the file as ``inspect --json`` does; raises :class:`Crash`."""
    try:
        result = load_session_bytes(data, source, "none", observer=LogAnalysis(keep_requests=True))
        error_json(result.error)
    except DshError:
        return  # a DshError out of a load is named, if not where a load keeps it
    except Exception as exc:  # noqa: BLE001 - what the fuzzer looks for
        raise Crash(f"reader: {type(exc).__name__}: {exc}") from exc
    if result.error is not None and not isinstance(result.error, DshError):
        raise Crash(f"reader: the load's error is a {type(result.error).__name__}")


class Services:
    """An auditor, an archiver with v4 copies (in ``root``) and a projector
    per view store of ``stores`` (its outcome index too), fed batches of
    records as the runtime feeds them (records, checkpoint, commit); the
    findings and dead letters of each batch go through each projector's
    outcome index into its store, as the one index of a deployment reads
    them from the topics."""

    def __init__(self, root: Path, stores: typing.Sequence[Path | str]) -> None:
        self.loop = asyncio.new_event_loop()
        self.projections = [Projection(ProjectorConfig(kafka=KAFKA, store=store)) for store in stores]
        self.policies: list[Policy[typing.Any, typing.Any]] = [
            Audit(AuditorConfig(kafka=KAFKA)),
            Archive(ArchiverConfig(kafka=KAFKA, root=root / "archive", v4_copies=True)), *self.projections]
        self.names = ["auditor", "archiver", *(f"projector ({backend_of(store).name} store)" for store in stores)]
        self.outputs = [RecordingOutputs() for _ in self.policies]
        self.runtimes = [ConsumerService(p.config, p, o) for p, o in zip(self.policies, self.outputs)]
        for policy, outputs in zip(self.policies, self.outputs):
            self.loop.run_until_complete(policy.open(outputs))
        self.offset = 0
        self.outcome_offset = 0

    def close(self) -> None:
        try:
            for policy in self.policies:
                self.loop.run_until_complete(policy.close(True))
        finally:
            self.loop.close()

    def feed(self, records: list[SessionRecord]) -> None:
        """One batch through each service; raises :class:`Crash`."""
        batch = [Fetched(r.key, r.value, r.headers, self.offset + i) for i, r in enumerate(records)]
        self.offset += len(batch)
        for name, policy, outputs, runtime in zip(self.names, self.policies, self.outputs, self.runtimes):
            outputs.sent.clear()
            try:
                runtime.handle_batch({TopicPartition(NAMES.events, 0): batch})
                policy.persist()
                self.loop.run_until_complete(outputs.publish())
                policy.committed({})
            except Exception as exc:  # noqa: BLE001 - the service would stop
                raise Crash(f"{name} stops: {type(exc).__name__}: {exc}") from exc
            for _, _, headers in outputs.on(NAMES.dead_letter):
                if headers["dsh-dlq-reason"].decode() not in NAMED:
                    raise Crash(f"{name}: {headers['dsh-dlq-reason'].decode()} dead letter: "
                                f"{headers['dsh-dlq-error'].decode()[:300]}")
        self.outcome_offset = max([self._index_outcomes(projection, [*self.outputs[:2], self.outputs[2 + index]],
                                                        self.names[2 + index])
                                   for index, projection in enumerate(self.projections)], default=self.outcome_offset)

    def _index_outcomes(self, projection: Projection, outputs: list[RecordingOutputs], name: str) -> int:
        """Index the outcomes of these services into the projection's store;
        returns the next outcome offset."""
        sent = [(topic, key, value, headers) for each in outputs for topic, key, value, headers in each.sent
                if topic in (NAMES.findings, NAMES.dead_letter)]
        outcomes = [Fetched(key, value, list(headers.items()), self.outcome_offset + i, topic)
                    for i, (topic, key, value, headers) in enumerate(sent)]
        try:
            projection.store.index_outcomes(
                [finding_row(r) for r in outcomes if r.topic == NAMES.findings],
                [letter_row(r) for r in outcomes if r.topic == NAMES.dead_letter], [], {})
        except Exception as exc:  # noqa: BLE001 - the projector's outcome index would stop
            raise Crash(f"outcome index of the {name} stops: {type(exc).__name__}: {exc}") from exc
        return self.outcome_offset + len(outcomes)


def _scratch() -> tempfile.TemporaryDirectory:
    """A directory for the services' stores (in memory where the system has one: no fsync cost)."""
    shm = Path("/dev/shm")
    return tempfile.TemporaryDirectory(prefix="dsh-fuzz-", dir=shm if shm.is_dir() else None)


@contextlib.contextmanager
def open_services(backends: typing.Sequence[str], postgres_dsn: str | None) -> typing.Iterator[Services]:
    """Fresh services, with a projector on a new store of each backend
    named (:data:`~consumers.runtime.store_backends.BACKENDS`), removed after."""
    chosen = [_BACKENDS[name] for name in backends]
    with _scratch() as tmp:
        stores = [new_location(backend, Path(tmp), postgres_dsn) for backend in chosen]
        try:
            services = Services(Path(tmp), stores)
            try:
                yield services
            finally:
                services.close()
        finally:
            for store in stores:
                discard_location(store, postgres_dsn)


def check_log(data: bytes, backends: typing.Sequence[str] = ("sqlite",), postgres_dsn: str | None = None) -> None:
    """Both checks over one log file's bytes (read where dsh's layout puts
    its header's id), its records fed to fresh services as one batch."""
    lines = data.split(b"\n")
    lines = lines[:-1] if not lines[-1] else lines
    check_reader(data, source_of(lines))
    with _quiet(), open_services(backends, postgres_dsn) as services:
        services.feed(_records(lines))


class Fuzzer:
    """Inputs ``0..n-1`` of one seed: input ``i`` is always the same log.
    Every input goes to the reader, every ``services_every``-th to the
    services too, which stay open over ``chunk`` inputs (each its own
    session) fed ``batch`` inputs to a poll batch, with a projector on a
    store of each of ``backends`` (PostgreSQL's made on the server
    ``postgres_dsn`` names). An input that crashes is written to ``found``
    (``None``: kept nowhere)."""

    def __init__(self, seed: int, services_every: int = 1, chunk: int = 1000, batch: int = 25,
                 backends: typing.Sequence[str] = ("sqlite",), postgres_dsn: str | None = None,
                 found: Path | None = CORPUS) -> None:
        unknown = set(backends) - set(_BACKENDS)
        if unknown:
            raise ValueError(f"no view-store backend {sorted(unknown)}: the registry has {sorted(_BACKENDS)}")
        self.seed = seed
        self.services_every = services_every
        self.chunk = chunk
        self.batch = batch
        self.backends = tuple(backends)
        self.postgres_dsn = postgres_dsn
        self.found = found

    def input(self, index: int) -> tuple[str, bytes]:
        source, lines = mutated(random.Random(f"{self.seed}:{index}"))
        return source, b"\n".join(lines) + b"\n"

    def run(self, start: int, stop: int, workers: int = 1,
            progress: typing.Callable[[int], None] | None = None) -> None:
        """Check inputs ``start..stop-1``, in chunks spread over ``workers``
        processes; ``progress`` gets the number checked after each chunk.
        A :class:`Crash` names an input that failed (the first chunk's to
        fail; the chunks not started yet are not)."""
        chunks = [(first, min(first + self.chunk, stop)) for first in range(start, stop, self.chunk)]
        done = 0
        if workers <= 1:
            for chunk in chunks:
                done += self._run_chunk(chunk)
                if progress:
                    progress(done)
            return
        pool = ProcessPoolExecutor(workers)
        try:
            for checked in pool.map(self._run_chunk, chunks):
                done += checked
                if progress:
                    progress(done)
        finally:
            pool.shutdown(cancel_futures=True)

    def _run_chunk(self, chunk: tuple[int, int]) -> int:
        """Check inputs ``chunk[0]..chunk[1]-1`` over one set of services."""
        with _quiet(), open_services(self.backends, self.postgres_dsn) as services:
            for first in range(chunk[0], chunk[1], self.batch):
                self._check_batch(services, range(first, min(first + self.batch, chunk[1])))
        return chunk[1] - chunk[0]

    def _check_batch(self, services: Services, indexes: range) -> None:
        """Read each input, then feed the records of those for the services
        as one batch; a batch that crashes is fed again one input at a time."""
        records: list[SessionRecord] = []
        for index in indexes:
            source, data = self.input(index)
            try:
                check_reader(data, source)
            except Crash as crash:
                raise self._crashed(index, source, data, crash) from crash.__cause__
            if index % self.services_every == 0:
                records += _records(data.split(b"\n")[:-1], f"~{index}")
        if not records:
            return
        try:
            services.feed(records)
        except Crash as crash:
            self._one_by_one([index for index in indexes if index % self.services_every == 0])
            raise Crash(f"fuzz seed {self.seed} inputs {indexes.start}..{indexes.stop - 1} crash as one batch "
                        f"but none alone: {crash}") from crash.__cause__

    def _one_by_one(self, indexes: list[int]) -> None:
        """Feed each input to fresh services as a batch of its own; raises
        :class:`Crash` naming the first that crashes."""
        with open_services(self.backends, self.postgres_dsn) as services:
            for index in indexes:
                source, data = self.input(index)
                try:
                    services.feed(_records(data.split(b"\n")[:-1], f"~{index}"))
                except Crash as crash:
                    raise self._crashed(index, source, data, crash) from crash.__cause__

    def _crashed(self, index: int, source: str, data: bytes, crash: Crash) -> Crash:
        """The crash, naming the input; the input is kept in :attr:`found`."""
        kept = ""
        if self.found is not None:
            path = self.found / f"seed-{self.seed}-input-{index}.jsonl"
            path.write_bytes(data)
            kept = f"; kept as {path}"
        return Crash(f"fuzz seed {self.seed} input {index} ({source}): {crash}{kept}; write it again with "
                     f"`python -m tests.fuzzing {self.seed} {index} FILE`")


if __name__ == "__main__":
    seed, index, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    source, data = Fuzzer(seed).input(index)
    out.write_bytes(data)
    print(f"{out}: input {index} of seed {seed}, read as {source}")
