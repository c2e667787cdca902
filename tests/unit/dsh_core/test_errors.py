"""The error tree drawn at the top of dsh_core.errors is the tree there is."""

from __future__ import annotations

import re
import typing

import pytest

import dsh_core.errors as errors


def _drawn() -> dict[str, str | None]:
    """Class name -> parent name, read from the module docstring's drawing."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^[ │├└─]*([A-Z]\w*Error)\b", line)
        if match is None:
            continue
        depth, name = match.start(1), match.group(1)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def _actual() -> dict[str, str | None]:
    parents: dict[str, str | None] = {"DshError": None}
    pending = [errors.DshError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub.__module__ == errors.__name__:
                parents[sub.__name__] = cls.__name__
                pending.append(sub)
    return parents


def test_the_drawing_is_the_tree() -> None:
    assert _drawn() == _actual()


def test_every_error_is_exported_and_every_category_is_a_known_word() -> None:
    categories = set(typing.get_args(errors.Category))
    for name in _actual():
        cls = getattr(errors, name)
        assert name in errors.__all__
        assert cls.category in categories, (name, cls.category)


@pytest.mark.parametrize(("error", "category"), [
    (errors.CorruptionError("x"), "corrupt-storage"),
    (errors.SequenceGapError("s", 3, 5), "corrupt-storage"),
    (errors.FormatUnsupportedError("x"), "unsupported-format"),
    (errors.SurfaceError("x"), "invalid-log"),
    (errors.HeldLimitError("s", 3, 9, 10, 100), "held-limit"),
    (errors.FencedError("x"), "pipeline"),
])
def test_categories(error: errors.DshError, category: str) -> None:
    assert error.category == category


def test_messages_say_expected_got_and_where() -> None:
    assert str(errors.SequenceGapError("s", 3, 5, "dsh.session-events[2]@17")) == (
        "session 's': expected seq 3, got 5 at dsh.session-events[2]@17")
    assert errors.HeldLimitError("s", 3, 9, 10, 100).message == (
        "session 's' waits for seq 3 and keeps at most 10 later records of 100 bytes in all; seq 9 is dead-lettered")
