"""The model-visible surface (spec §4): which seqs currently produce messages.

:class:`Surface` validates one candidate event against the rules of §4.1 in
the reference's order and returns a plan; :meth:`Surface.commit` applies it.
Validation never mutates, so a rejected event leaves the surface unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from msgspec import UNSET

from .errors import SurfaceError
from .events import SURFACE_TYPES
from .jsonvalue import MAX_SAFE_INTEGER, json_equal

__all__ = ["Surface", "SurfacePlan", "Replacement", "fold_surface"]


class Replacement(NamedTuple):
    """One applied replace: the replacing seq, its range, the nodes it removed."""

    seq: int
    start: int
    end: int
    shadowed_seqs: tuple[int, ...]


class SurfacePlan(NamedTuple):
    """A validated transition: ``append`` (start_index is None) or ``replace``."""

    seq: int
    start_index: int | None = None
    end_index: int | None = None
    start: int = 0
    end: int = 0


def _is_seq(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _surface_op(event_type: str, seq: int, surface_op: Any, sources: Any, has_op: bool, has_sources: bool) -> Any:
    if event_type not in SURFACE_TYPES:
        if has_op:
            raise SurfaceError(f'seq {seq}: event "{event_type}" is not surface-eligible and cannot carry surfaceOp')
        if has_sources:
            raise SurfaceError(f'seq {seq}: event "{event_type}" is not surface-eligible and cannot carry sourceEventSeqs')
        return None
    if not has_op:
        raise SurfaceError(f'seq {seq}: event "{event_type}" is surface-eligible and requires a surfaceOp')
    if surface_op == "append" and type(surface_op) is str:
        return surface_op
    if not isinstance(surface_op, dict):
        raise SurfaceError(f'seq {seq}: event "{event_type}" carries an invalid surfaceOp {surface_op!r}')
    if (len(surface_op) != 3 or surface_op.get("op") != "replace"
            or not _is_seq(surface_op.get("start")) or not _is_seq(surface_op.get("end"))):
        raise SurfaceError(f'seq {seq}: event "{event_type}" carries an invalid replace surfaceOp {dict(surface_op)!r}')
    return surface_op


def _check_sources(event_type: str, seq: int, sources: Any, has_sources: bool, shadowed: list[int]) -> None:
    present: set[int] | frozenset[int] = frozenset()
    if has_sources:
        if not isinstance(sources, (list, tuple)):
            raise SurfaceError(f"seq {seq}: sourceEventSeqs must be an array when present")
        if not sources:
            if event_type != "assistant/message":
                raise SurfaceError(f"seq {seq}: sourceEventSeqs must not be empty except on assistant/message")
        else:
            # Whole-list checks in C; the element walk only runs to name a culprit.
            if set(map(type, sources)) != {int} or min(sources) < 0 or max(sources) > MAX_SAFE_INTEGER:
                culprit = next(source for source in sources if not _is_seq(source))
                raise SurfaceError(
                    f'seq {seq}: event "{event_type}" sourceEventSeqs must contain non-negative safe integers, got {culprit!r}')
            present = set(sources)
            if len(present) != len(sources):
                raise SurfaceError(f"seq {seq}: sourceEventSeqs must not contain duplicates")
            if max(sources) >= seq:
                later = next(source for source in sources if source >= seq)
                raise SurfaceError(f"seq {seq}: sourceEventSeqs must reference earlier events: {later} >= current seq {seq}")
    missing = [node for node in shadowed if node not in present]
    if missing:
        raise SurfaceError(
            f"seq {seq}: surface replace: sourceEventSeqs must include every shadowed surface node; missing {', '.join(map(str, missing))}")


def _tool_result_rest(data: Any) -> Any:
    """A tool/result payload with its one block's inner content blanked."""
    rest = dict(data)
    message = dict(data["message"])
    block = dict(message["content"][0])
    block["content"] = None
    message["content"] = [block]
    rest["message"] = message
    return rest


class Surface:
    """Incremental surface state: ``nodes`` in model order and the number of
    replacements applied (``replace_generation``)."""

    __slots__ = ("nodes", "replace_generation")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.replace_generation = 0

    def plan(self, event_type: str, seq: int, data: Any, surface_op: Any, sources: Any,
             has_op: bool, has_sources: bool, data_at: Callable[[int], tuple[str, Any]]) -> SurfacePlan | None:
        """Validate a candidate event (spec §4.1 steps 2–7).

        ``data_at(seq)`` returns ``(type, data)`` of an earlier surface event;
        it is only called for a ``tool/result`` replacing another node.
        Returns ``None`` for a non-surface event.
        """
        op = _surface_op(event_type, seq, surface_op, sources, has_op, has_sources)
        if op is None:
            return None
        if op == "append" and type(op) is str:
            _check_sources(event_type, seq, sources, has_sources, [])
            return SurfacePlan(seq)
        start, end = op["start"], op["end"]
        nodes = self.nodes
        try:
            start_index = nodes.index(start)
        except ValueError:
            raise SurfaceError(f"seq {seq}: surface replace: start seq {start} not found in surface") from None
        try:
            end_index = nodes.index(end)
        except ValueError:
            raise SurfaceError(f"seq {seq}: surface replace: end seq {end} not found in surface") from None
        if start_index > end_index:
            raise SurfaceError(
                f"seq {seq}: surface replace: start seq {start} (index {start_index}) is after end seq {end} (index {end_index})")
        shadowed = nodes[start_index:end_index + 1]
        _check_sources(event_type, seq, sources, has_sources, shadowed)
        if event_type == "tool/result":
            if len(shadowed) != 1:
                raise SurfaceError(f"seq {seq}: tool/result surface replacement must rewrite exactly one current node")
            original_type, original_data = data_at(shadowed[0])
            if original_type != "tool/result":
                raise SurfaceError(f"seq {seq}: tool/result surface replacement must target a current tool/result")
            if not json_equal(_tool_result_rest(original_data), _tool_result_rest(data)):
                raise SurfaceError(f"seq {seq}: tool/result surface replacement may change only content")
        return SurfacePlan(seq, start_index, end_index, start, end)

    def commit(self, plan: SurfacePlan) -> Replacement | None:
        """Apply a plan made by :meth:`plan` against the current state."""
        if plan.start_index is None:
            self.nodes.append(plan.seq)
            return None
        shadowed = tuple(self.nodes[plan.start_index:plan.end_index + 1])
        self.nodes[plan.start_index:plan.end_index + 1] = [plan.seq]
        self.replace_generation += 1
        return Replacement(plan.seq, plan.start, plan.end, shadowed)


def fold_surface(events: list[Any]) -> tuple[list[int], list[Replacement]]:
    """Fold a whole log (Events, seq == index) into ``(nodes, replacements)``."""
    surface = Surface()
    replacements: list[Replacement] = []
    by_seq = {}
    for event in events:
        plan = surface.plan(event.type, event.seq, event.data, event.surfaceOp, event.sourceEventSeqs,
                            event.surfaceOp is not UNSET, event.sourceEventSeqs is not UNSET,
                            lambda s: (by_seq[s].type, by_seq[s].data))
        if plan is not None:
            by_seq[event.seq] = event
            replaced = surface.commit(plan)
            if replaced is not None:
                replacements.append(replaced)
    return list(surface.nodes), replacements

