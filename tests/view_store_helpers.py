"""Fleets projected into a view store, for the store and reader tests."""

from __future__ import annotations

from consumers.projector import Projection, ProjectorConfig, ViewStore
from dsh_kafka.records import KIND_RECORD
from producers.simulator import SimulatorConfig, simulate_session
from tests.policy_driver import KAFKA, Fetched, fetched, run_batch


def simulated_fleet(count: int, seed: int):
    config = SimulatorConfig(sessions=count, seed=seed, min_turns=2, max_turns=4)
    sessions = [simulate_session(config, index) for index in range(count)]
    return [(truth, [record for batch in batches for record in batch]) for truth, batches in sessions]


def stored_fleet(location, count: int = 6):
    """A fleet projected with distinct record times (session i at i seconds),
    its last session held at a gap."""
    fleet = simulated_fleet(count, seed=75)
    rows = []
    for index, (truth, records) in enumerate(fleet):
        if index == count - 1:
            records = [r for r in records if not (r.kind == KIND_RECORD and r.seq == 3)]
        rows += [Fetched(r.key, r.value, r.headers, len(rows) + n, timestamp=1_000 * (index + 1))
                 for n, r in enumerate(records)]
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=location)), rows)
    store = ViewStore(location)
    try:
        with store.database.transaction() as db:
            db.execute("INSERT INTO findings (topic, partition, \"offset\", session_id, rule, severity, seq, turn, step, "
                       "detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       ("dsh.findings", 0, 7, fleet[1][0].session_id, "request-mismatch", "error", 5, 1, 1, "d", 50))
    finally:
        store.close()
    return fleet


def project(location, records, **settings) -> None:
    """The records projected into the store at ``location``, as one batch."""
    run_batch(Projection(ProjectorConfig(kafka=KAFKA, store=location, **settings)), fetched(records))


def listing_columns(store: ViewStore, session_id: str) -> tuple:
    """A session's status, next seq and listing columns, as stored."""
    return tuple(store.db.execute("SELECT status, next_seq, turn_count, message_count, cwd, created_at, "
                                  "last_activity FROM sessions WHERE session_id = ?", (session_id,)).fetchone())
