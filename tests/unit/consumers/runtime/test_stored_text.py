"""The stores' text escape: any string, lone surrogates and NUL included,
is written as text both backends hold and read back exactly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumers.runtime.stored_text import ESCAPE, read_row, read_text, stored_parameters, stored_text

# every code point, surrogates included, with the ones the escape concerns made likely
_TEXT = st.text(st.one_of(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
                          st.sampled_from(["\x00", "\ud800", "\udfff", ESCAPE, ";", "0", "d"])))


@given(_TEXT, _TEXT)
def test_any_text_is_stored_as_text_both_backends_hold_and_read_back_exactly(text, other):
    stored = stored_text(text)
    stored.encode("utf-8")  # no lone surrogate: SQLite and PostgreSQL take it
    assert "\x00" not in stored  # PostgreSQL's text holds no NUL
    assert read_text(stored) == text
    assert (stored == stored_text(other)) == (text == other)  # injective
    assert (text in other) <= (stored in stored_text(other))  # a search for it still finds it


def test_rows_and_parameters_keep_their_other_values_and_plain_text_as_they_are():
    parameters = ("plain", 3, b"\x00", None)
    assert stored_parameters(parameters) is parameters
    assert stored_parameters(("a\x00", 3)) == [f"a{ESCAPE}0;", 3]
    assert read_row([f"a{ESCAPE}d800;", 3, b"x"]) == ("a\ud800", 3, b"x")
    row = ("plain", 1)
    assert read_row(row) is row and read_row(["plain", 1]) == row
