"""The model-visible surface (docs/formats/v0.md §4): which seqs currently produce messages.

:meth:`Surface.admit` validates one candidate event against the rules of
v0 §4.1 in the reference's order, then applies it; nothing changes before every
rule has passed, so a rejected event leaves the surface unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from msgspec import UNSET

from .errors import SurfaceError
from .events import SURFACE_TYPES
from .jsonvalue import MAX_SAFE_INTEGER, json_equal

__all__ = ["Surface", "Replacement", "fold_surface"]


class Replacement(NamedTuple):
    """One applied replace: the replacing seq, its range, the nodes it removed."""

    seq: int
    start: int
    end: int
    shadowed_seqs: tuple[int, ...]


def _is_seq(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _check_sources(event_type: str, seq: int, sources: Any, has_sources: bool, shadowed: list[int]) -> None:
    """``sourceEventSeqs`` rules (v0 §4.1 steps 5–6); ``null`` is present, and no array."""
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

    def admit(self, event_type: str, seq: int, data: Any, surface_op: Any, sources: Any,
              has_op: bool, has_sources: bool, data_at: Callable[[int], tuple[str, Any]]) -> Replacement | bool:
        """Validate a candidate event (docs/formats/v0.md §4.1 steps 2–7), then apply it.

        Returns ``False`` for a non-surface event, ``True`` for an append and
        the :class:`Replacement` for a replace. Everything is checked before
        anything changes, so a refused event leaves the surface as it was.
        ``data_at(seq)`` returns ``(type, data)`` of an earlier surface event;
        it is only called for a ``tool/result`` replacing another node.
        """
        if event_type not in SURFACE_TYPES:
            if has_op:
                raise SurfaceError(f'seq {seq}: event "{event_type}" is not surface-eligible and cannot carry surfaceOp')
            if has_sources:
                raise SurfaceError(f'seq {seq}: event "{event_type}" is not surface-eligible and cannot carry sourceEventSeqs')
            return False
        if surface_op == "append" and type(surface_op) is str:
            if has_sources:
                _check_sources(event_type, seq, sources, True, [])
            self.nodes.append(seq)
            return True
        if not has_op:
            raise SurfaceError(f'seq {seq}: event "{event_type}" is surface-eligible and requires a surfaceOp')
        if not isinstance(surface_op, dict):
            raise SurfaceError(f'seq {seq}: event "{event_type}" carries an invalid surfaceOp {surface_op!r}')
        if (len(surface_op) != 3 or surface_op.get("op") != "replace"
                or not _is_seq(surface_op.get("start")) or not _is_seq(surface_op.get("end"))):
            raise SurfaceError(f'seq {seq}: event "{event_type}" carries an invalid replace surfaceOp {dict(surface_op)!r}')
        start, end = surface_op["start"], surface_op["end"]
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
        nodes[start_index:end_index + 1] = [seq]
        self.replace_generation += 1
        return Replacement(seq, start, end, tuple(shadowed))


def fold_surface(events: list[Any]) -> tuple[list[int], list[Replacement]]:
    """Fold a whole log (Events, seq == index) into ``(nodes, replacements)``."""
    surface = Surface()
    replacements: list[Replacement] = []
    by_seq: dict[int, Any] = {}
    for event in events:
        admitted = surface.admit(event.type, event.seq, event.data, event.surfaceOp, event.sourceEventSeqs,
                                 event.surfaceOp is not UNSET, event.sourceEventSeqs is not UNSET,
                                 lambda s: (by_seq[s].type, by_seq[s].data))
        if admitted is not False:
            by_seq[event.seq] = event
            if isinstance(admitted, Replacement):
                replacements.append(admitted)
    return list(surface.nodes), replacements
