"""The domain's errors: their categories and messages (the drawings: tests/unit/test_error_trees.py)."""

from __future__ import annotations

import pytest

import dsh_core.errors as errors


@pytest.mark.parametrize(("error", "category"), [
    (errors.CorruptionError("x"), "corrupt-storage"),
    (errors.SequenceGapError("s", 3, 5), "corrupt-storage"),
    (errors.FormatUnsupportedError("x"), "unsupported-format"),
    (errors.SurfaceError("x"), "invalid-log"),
    (errors.HeldLimitError("s", 3, 9, 10, 100), "held-limit"),
    (errors.LayoutError("x"), "pipeline"),
])
def test_categories(error: errors.DshError, category: str) -> None:
    assert error.category == category


def test_messages_say_expected_got_and_where() -> None:
    assert str(errors.SequenceGapError("s", 3, 5, "dsh.session-events[2]@17")) == (
        "session 's': expected seq 3, got 5 at dsh.session-events[2]@17")
    assert errors.HeldLimitError("s", 3, 9, 10, 100).message == (
        "session 's' waits for seq 3 and keeps at most 10 later records of 100 bytes in all; seq 9 is dead-lettered")
