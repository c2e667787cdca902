"""One session as the projector holds it: :class:`ProjectedSession`, its
fold of the session's format, its analysis (the token, turn-end and cost
counters it feeds), status (``open``, ``held``, ``refused``, ``conflicted``)
and the view and store rows made from them (:meth:`ProjectedSession.change`).
The records' routing, the batch's store transaction and the view heads are
the policy's (:mod:`consumers.projector.service`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from prometheus_client import Counter

from dsh_core.analysis import LogAnalysis
from dsh_core.errors import DshError, UnstorableError
from dsh_core.event_time import line_time
from dsh_core.formats import SessionFold
from dsh_core.fold_snapshot import snapshot_fold
from dsh_core.request import MessagesDigest

from ..runtime.metrics import LabelValues
from ..runtime.sequencing import AppliedDigests, HeldRecords
from .session_pages import model_order
from .store import SessionChange
from .timings import StepClock

__all__ = ["PriceFunction", "ProjectedSession"]

REFUSED = Counter("dsh_projector_sessions_refused_total", "Sessions whose log was refused, by category.", ["category"])
TOKENS = Counter("dsh_tokens_total", "Tokens reported by assistant messages, by provider, model and kind.",
                 ["provider", "model", "kind"])
TURN_ENDS = Counter("dsh_turn_ends_total", "Turns ended, by end reason.", ["reason"])
COST = Counter("dsh_cost_usd_total", "What assistant messages' tokens cost by the price table (US dollars), by "
               "provider and model; a model without a price adds nothing.", ["provider", "model"])

# Label values come from log content: bounded, so /metrics stays small.
_reasons, _models = LabelValues(32), LabelValues(256)
# Label lookups cost more than the increments (one per assistant message).
_turn_ends = functools.lru_cache(maxsize=256)(TURN_ENDS.labels)
_tokens = functools.lru_cache(maxsize=4096)(TOKENS.labels)
_cost = functools.lru_cache(maxsize=1024)(COST.labels)
#: What a usage row costs: ``(provider, model, token counts)`` to US dollars, ``None`` without a price.
PriceFunction = Callable[[str, str, Mapping[str, Any]], float | None]


def _count_turn_end(reason: Any) -> None:
    _turn_ends(_reasons(str(reason.get("kind")) if isinstance(reason, dict) else "unknown")).inc()


def _count_usage(provider: str, model: str, counted: dict[str, int]) -> None:
    provider, model = _models(provider), _models(model)
    for kind, value in counted.items():
        if value > 0:  # a negative count is the log's to keep, not a counter's
            _tokens(provider, model, kind).inc(value)


def _analysis(counted: list[tuple[str, str, dict[str, int]]] | None = None) -> LogAnalysis:
    """The projector's analysis; the usage it counts is also added to
    ``counted``, when given."""
    def on_usage(provider: str, model: str, counts: dict[str, int]) -> None:
        _count_usage(provider, model, counts)
        if counted is not None:
            counted.append((provider, model, counts))

    return LogAnalysis(keep_requests=False, on_turn_end=_count_turn_end, on_usage=on_usage, count_requests=False)


@dataclass
class ProjectedSession:
    """One session's fold, analysis and status (``open``, ``held``, ``refused``);
    ``conflicted`` once a second writer showed (its view's status says so
    unless the session is refused)."""

    session_id: str
    partition: int
    held: HeldRecords
    digests: AppliedDigests
    fold: SessionFold | None = None
    analysis: LogAnalysis = field(init=False)  # its usage callback adds to counted (__post_init__)
    status: str = "open"
    conflicted: bool = False
    error: str | None = None
    digest: MessagesDigest = field(default_factory=MessagesDigest)
    stored_surface: set[int] = field(default_factory=set)  # seqs with a row in the surface table
    applied: int = 0  # events folded since the policy last counted them
    last_activity: int | None = None  # ms: the newest event time of the records this process applied
    ingested_at: int | None = None  # ms: the newest topic timestamp of the records this process applied
    stored_usage: list[dict[str, Any]] | None = None  # the usage the store holds (None: not known)
    clock: StepClock = field(default_factory=StepClock)
    surface_times: dict[int, int] = field(default_factory=dict)  # event times of the seqs applied since change()
    counted: list[tuple[str, str, dict[str, int]]] = field(default_factory=list)  # usage of the line being applied
    price: PriceFunction | None = None

    def __post_init__(self) -> None:
        self.analysis = _analysis(self.counted)

    def next_seq(self) -> int | None:
        return self.fold.count if self.fold is not None else None

    def held_bytes(self) -> int:
        return self.held.bytes

    def apply(self, value: bytes, count: int) -> bool:
        fold = self.fold
        assert fold is not None, "records are applied after the header"  # next_seq() is None before
        before = fold.count
        self.counted.clear()
        fold.apply(value)  # a DecodeError refuses the record, not the session
        if fold.error is not None:
            self.refuse(fold.error)
            raise fold.error
        self.applied += fold.count - before
        self.timed(value, fold.count - 1)
        return True

    def timed(self, line: bytes, seq: int) -> None:
        """Note the event times of a line applied (its last event at ``seq``)."""
        times = line_time(line)
        if times is None:
            return
        self.last_activity = max(self.last_activity or times.last, times.last)
        if times.type != "session":
            self.surface_times[seq] = times.last
            self.clock.observe(times, self.counted)
        if self.price is not None:
            for provider, model, counts in self.counted:
                cost = self.price(provider, model, counts)
                if cost:
                    _cost(_models(provider), _models(model)).inc(cost)

    def unstorable(self, error: UnstorableError) -> SessionChange:
        """The rows of a session the store refused rows of: refused, with
        neither fold nor analysis (what the store refused is in them)."""
        self.refuse(error)
        self.fold, self.analysis = None, _analysis(self.counted)
        return self.change()

    def refuse(self, error: DshError) -> None:
        self.status = "refused"
        text = f"[{error.category}] {type(error).__name__}: {error.message}"
        self.error = text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate stays readable
        REFUSED.labels(error.category).inc()

    def view(self) -> dict[str, Any]:
        fold, analysis = self.fold, self.analysis
        turns = analysis.turns
        next_seq = fold.count if fold is not None else 0
        view: dict[str, Any] = {"sessionId": self.session_id, "status": self.status,
                                "header": fold.header.to_dict() if fold is not None and fold.header else None,
                                "nextSeq": next_seq, "turns": turns,
                                "lastTurnEnd": turns[-1]["reason"] if turns else None,
                                "usage": [{"provider": p, "model": m, **dict(t)} for (p, m), t in analysis.usage.items()]}
        if fold is not None:
            state = fold.state
            surface = state.surface
            messages = state.current_messages()
            view |= {"surfaceLength": len(surface.nodes), "replaceGeneration": surface.replace_generation,
                     "messageCount": len(messages),
                     "messagesDigest": self.digest.of(messages, surface.replace_generation),
                     "requestHeader": state.header, "requestContext": state.context,
                     "requestHeaderChanges": analysis.header_changes}
            runs = model_order(surface.nodes)
            if len(runs) > 1:  # the model's order is not the seqs' (a replace stands where its range was)
                view["modelOrder"] = runs
        if self.status == "held":
            view["heldFrom"] = next_seq
            view["heldRecords"] = len(self.held)
        if self.error:
            view["error"] = self.error
        if fold is not None and fold.idle and self.status == "open":
            view["status"] = "idle"
        if self.conflicted:
            view["conflicted"] = True
            if self.status != "refused":
                view["status"] = "conflicted"
        return view

    def change(self) -> SessionChange:
        """The rows to store for this session now."""
        current = self.fold.state.surface_events() if self.fold is not None else {}
        gone = self.stored_surface - current.keys()  # surface rows change by difference
        new = [(seq, *current[seq]) for seq in current.keys() - self.stored_surface]
        self.stored_surface = set(current)
        held = self.held.changes() if self.held.dirty else None
        snapshot = snapshot_fold(self.fold, with_surface_events=False) if self.fold is not None else None
        view = self.view()
        usage_changed = view["usage"] != self.stored_usage
        self.stored_usage = view["usage"]
        times, self.surface_times = self.surface_times, {}
        return SessionChange(self.session_id, self.partition, view, snapshot, self.error, gone, new, held,
                             self.digests.changes(), self.last_activity, usage_changed, self.ingested_at,
                             self.clock.changed(), {seq: times[seq] for seq, _, _ in new if seq in times})
