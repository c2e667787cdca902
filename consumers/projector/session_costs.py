"""What a session costs, priced in the store at the reader's prices.

The list of sessions is sorted by cost and shows it, so both come from one
figure: :func:`cost_column` is the SQL of a session's cost (its ``usage``
rows, each kind of token at the price of the row's model, the provider's
own price first), computed by the query that lists the sessions, from the
price table the reader is given (``serve --prices``), never stored: a
session's cost follows the table the server runs with. A session using a
model the table does not price has no cost (:data:`UNPRICED` in the
query, ``None`` shown), listed after every priced one; a session without
usage rows costs 0.

Ordering by cost prices every session on each page (the key is no column
an index could hold): a page costs one read of the store's usage rows,
not what the page holds.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["ModelPrice", "UNPRICED", "cost_column", "cost_usd"]

#: The cost key of a session using a model without a price: below every cost.
UNPRICED = -1
#: A usage row's token columns, and the price each kind is charged at.
_KINDS = (("inputTokens", "input"), ("cacheReadTokens", "cache_read"), ("cacheWriteTokens", "cache_write"),
          ("outputTokens", "output"), ("reasoningTokens", "reasoning"))
_RATES = tuple(rate for _, rate in _KINDS)


class ModelPrice(Protocol):
    """US dollars per million tokens of one model, as one provider serves it
    (``provider`` ``None``: whoever serves it; ``reasoning`` ``None``: the
    output price). :class:`dsh_pipeline.prices.Price` is one."""

    @property
    def provider(self) -> str | None: ...
    @property
    def model(self) -> str: ...
    @property
    def input(self) -> float: ...
    @property
    def output(self) -> float: ...
    @property
    def cache_read(self) -> float: ...
    @property
    def cache_write(self) -> float: ...
    @property
    def reasoning(self) -> float | None: ...


def cost_column(prices: Sequence[ModelPrice], among: int | None = None) -> tuple[str, str, str, list[Any]]:
    """``(with, join, column, parameters)``: the ``WITH`` clause naming the
    price table ``price`` (to start the statement), the ``LEFT JOIN`` of
    each session's cost to its sessions row ``s`` (all sessions' costs, or
    ``among`` of them: its ``IN`` list takes their ids as parameters, after
    those of the ``WITH`` clause), the column of a session's cost in US
    dollars (or :data:`UNPRICED`), and the ``WITH`` clause's parameters."""
    # the first row fixes the columns' types; it prices nothing
    rows: list[tuple[Any, ...]] = [(None, None, *(0.0 for _ in _RATES))]
    rows += [(price.provider, price.model, *(float(rate) for rate in (
        price.input, price.cache_read, price.cache_write, price.output,
        price.output if price.reasoning is None else price.reasoning))) for price in prices]
    width = 2 + len(_RATES)
    with_ = (f"WITH price (provider, model, {', '.join(_RATES)}) AS (VALUES "
             + ", ".join(f"({', '.join('?' * width)})" for _ in rows) + ") ")
    terms = " + ".join(f"(CASE WHEN u.{column} > 0 THEN u.{column} ELSE 0 END) * COALESCE(own.{rate}, base.{rate})"
                       for column, rate in _KINDS)
    join = (f"LEFT JOIN (SELECT u.session_id, CASE WHEN COUNT(*) = COUNT(COALESCE(own.model, base.model)) "
            f"THEN SUM({terms}) / 1000000.0 ELSE {UNPRICED} END AS cost FROM usage u "
            "LEFT JOIN price own ON own.provider = u.provider AND own.model = u.model "
            "LEFT JOIN price base ON base.provider IS NULL AND base.model = u.model "
            + (f"WHERE u.session_id IN ({', '.join('?' * among)}) " if among is not None else "")
            + "GROUP BY u.session_id) AS costs ON costs.session_id = s.session_id")
    return with_, join, "COALESCE(costs.cost, 0)", [value for row in rows for value in row]


def cost_usd(key: float | int) -> float | None:
    """A session's cost as the list shows it (``None``: a model without a price)."""
    return None if key < 0 else round(float(key), 6)
