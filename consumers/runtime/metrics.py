"""What every consumer service reports, and a per-batch tally of counters."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Enum, Gauge, Histogram

__all__ = ["RECORDS", "DEAD_LETTERS", "BATCH_RECORDS", "BATCH_SECONDS", "LAG", "COMMITS", "STATE", "LabelValues", "Tally"]

RECORDS = Counter("dsh_consumer_records_total", "Records consumed, by service and kind (also undecodable; "
                  "refused-again: redriven records refused for the reason of their dead letters, which stand).",
                  ["service", "kind"])
DEAD_LETTERS = Counter("dsh_consumer_dead_letters_total", "Records sent to the dead-letter topic, by service and reason.",
                       ["service", "reason"])
BATCH_RECORDS = Histogram("dsh_consumer_batch_records", "Records per poll batch.", ["service"],
                          buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000))
BATCH_SECONDS = Histogram("dsh_consumer_batch_seconds", "Time to handle and persist one batch (its commit overlaps the next).", ["service"],
                          buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
LAG = Gauge("dsh_consumer_lag_records", "Records behind the partition's end offset.", ["service", "partition"])
COMMITS = Counter("dsh_consumer_commits_total", "Offset commits after durable effects.", ["service"])
STATE = Enum("dsh_consumer_state", "Where each consumer group member is in its life (1 for its state).", ["service"],
             states=["unopened", "starting", "running", "draining", "stopped", "failed"])


class Tally:
    """Counter increments summed over a batch and applied once: the
    per-call cost of ``inc`` shows in consumer profiles."""

    __slots__ = ("_amounts",)

    def __init__(self) -> None:
        self._amounts: dict[Any, float] = {}

    def add(self, counter: Any, amount: float = 1) -> None:
        self._amounts[counter] = self._amounts.get(counter, 0) + amount

    def flush(self) -> None:
        amounts, self._amounts = self._amounts, {}
        for counter, amount in amounts.items():
            counter.inc(amount)


class LabelValues:
    """Label values copied from log content (model names, end reasons),
    bounded: the first ``limit`` distinct values keep their name (valid
    UTF-8, at most 100 characters); later ones are counted as ``other``."""

    __slots__ = ("limit", "_known")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, value: str) -> str:
        value = value.encode("utf-8", "replace").decode("utf-8")[:100]
        if value in self._known:
            return value
        if len(self._known) < self.limit:
            self._known.add(value)
            return value
        return "other"
