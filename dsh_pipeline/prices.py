"""Model prices: what a session's tokens cost.

A price table (TOML, :file:`prices.toml` in this package by default, or
``serve --prices FILE``) gives US dollars per million tokens of each kind a
dsh log counts (disjoint: ``input`` not read from the cache, ``cache_read``,
``cache_write``, ``output``, ``reasoning``) for a model, optionally only as
one provider serves it. :meth:`PriceTable.cost` prices one usage row; a
model the table does not name has no cost (``None``), never a cost of 0.
A table that is not what this module reads is a
:class:`~dsh_core.errors.PipelineError` naming the file and the entry.
"""

from __future__ import annotations

import datetime
import math
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import msgspec

from dsh_core.errors import PipelineError

__all__ = ["Price", "PriceTable", "load_prices"]

#: A usage row's token columns and the price each is charged at.
_KINDS = {"inputTokens": "input", "cacheReadTokens": "cache_read", "cacheWriteTokens": "cache_write",
          "outputTokens": "output", "reasoningTokens": "reasoning"}


class Price(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """US dollars per million tokens of one model (as one provider serves it)."""

    model: str
    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0
    reasoning: float | None = None  # None: the output price
    provider: str | None = None  # None: whoever serves the model


class _PriceFile(msgspec.Struct, forbid_unknown_fields=True):
    taken: datetime.date
    source: str
    price: list[Price]


class PriceTable:
    """Prices by model (and provider), when and where they were taken."""

    def __init__(self, prices: list[Price], taken: datetime.date, source: str) -> None:
        self.taken, self.source = taken, source
        self._prices = {(price.provider, price.model): price for price in prices}

    @property
    def prices(self) -> tuple[Price, ...]:
        """Every price of the table."""
        return tuple(self._prices.values())

    def price(self, provider: str | None, model: str | None) -> Price | None:
        """The provider's own price of the model, else the model's price."""
        if model is None:
            return None
        return self._prices.get((provider, model)) or self._prices.get((None, model))

    def cost(self, provider: str | None, model: str | None, usage: Mapping[str, Any]) -> float | None:
        """The US dollars ``usage`` (a row of token counts) cost; ``None``
        where the table has no price for the model."""
        price = self.price(provider, model)
        if price is None:
            return None
        rates = {"input": price.input, "cache_read": price.cache_read, "cache_write": price.cache_write,
                 "output": price.output, "reasoning": price.output if price.reasoning is None else price.reasoning}
        total = sum(rates[kind] * count for column, kind in _KINDS.items()
                    if isinstance(count := usage.get(column), int) and not isinstance(count, bool) and count > 0)
        return round(total / 1_000_000, 6)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The table at ``path``, else this package's."""
    where = str(path) if path is not None else "the packaged prices.toml"
    try:
        text = Path(path).read_bytes() if path is not None else \
            resources.files(__package__).joinpath("prices.toml").read_bytes()
        found = msgspec.convert(tomllib.loads(text.decode("utf-8")), _PriceFile)
    except OSError as error:
        raise PipelineError(f"{where}: cannot read the price table: {error.strerror or error}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise PipelineError(f"{where}: not a TOML file: {error}") from None
    except msgspec.ValidationError as error:  # names the entry: `$.price[2].input`
        raise PipelineError(f"{where}: not a price table: {error}") from None
    seen: set[tuple[str | None, str]] = set()
    for index, price in enumerate(found.price):
        rates = (price.input, price.output, price.cache_read, price.cache_write, price.reasoning or 0.0)
        if any(rate < 0 or not math.isfinite(rate) for rate in rates):  # an infinite cost is no JSON number
            raise PipelineError(f"{where}: price[{index}] ({price.model}): a price is negative, infinite or not a "
                                "number")
        if (price.provider, price.model) in seen:
            raise PipelineError(f"{where}: price[{index}]: {price.model} is priced twice"
                                + (f" for provider {price.provider}" if price.provider else ""))
        seen.add((price.provider, price.model))
    return PriceTable(found.price, found.taken, found.source)
