"""Derivation (docs/formats/v0.md §5): from surface events to the model's message history."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["derive_event_message", "DerivedHistory"]


def derive_event_message(event_type: str, data: Any) -> Any:
    """The message an event projects to, or ``None``.

    ``user/message`` → its data verbatim (even with empty content);
    ``assistant/message`` → ``data.message`` unless its content is empty;
    ``tool/result`` → ``data.message``; every other type → ``None``.
    """
    if event_type == "user/message":
        return data
    if event_type == "assistant/message":
        message = data["message"]
        return message if len(message["content"]) else None
    if event_type == "tool/result":
        return data["message"]
    return None


class DerivedHistory:
    """The cached message history over a :class:`~dsh_core.surface.Surface`.

    Each surface node is projected (and frozen) once, when first seen; a
    replace (a new ``replace_generation``) rebuilds. :meth:`messages` returns
    a fresh list per call, so a list a caller holds never grows.
    """

    __slots__ = ("_cache", "_nodes_seen", "_generation", "_project")

    def __init__(self, project: Callable[[int], Any]) -> None:
        # project(seq) -> frozen derived message of that surface event, or None
        self._project = project
        self._cache: list[Any] = []
        self._nodes_seen = 0
        self._generation = 0

    def messages(self, nodes: list[int], generation: int) -> list[Any]:
        return list(self.current(nodes, generation))

    def current(self, nodes: list[int], generation: int) -> list[Any]:
        """The cached list itself (callers must not mutate it)."""
        if generation != self._generation:
            self._cache = []
            self._nodes_seen = 0
            self._generation = generation
        if self._nodes_seen < len(nodes):
            project = self._project
            cache = self._cache
            for seq in nodes[self._nodes_seen:]:
                message = project(seq)
                if message is not None:
                    cache.append(message)
            self._nodes_seen = len(nodes)
        return self._cache

