"""The configured strategy over a BookSnapshot, for Python callers (the engine's kind code and
parameters, tests, the risk fuzzer): the strategy runs as the core runs it (``registry.quote``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.book import as_levels
from engine.contract import ContractConfig, at_units, lots_below
from engine.events import BookSnapshot
from engine.fastinit import frozen_maker
from engine.strategies import registry
from engine.strategy import LABEL_CODE, Quote, QuoteConfig, quote_lots


class Quoter:
    """The configured strategy over a BookSnapshot: a Python caller's adapter to
    :func:`engine.strategies.registry.quote` (the core calls the same entry with its own book, in its units);
    sizes and prices in and out as the exchange's decimals. The engine reads its kind code and
    parameters from it."""

    __slots__ = ("kind", "params", "lots", "tick", "step")

    def __init__(
        self,
        cfg: QuoteConfig,
        contract: ContractConfig,
        strategy: str = "baseline",
        params: Mapping[str, float] | None = None,
    ) -> None:
        self.kind, self.params = registry.resolve(strategy, params or {}, cfg)
        self.tick, self.step = contract.tick, contract.size_step
        self.lots = quote_lots(cfg, contract)

    def __call__(
        self, book: BookSnapshot, *, label: str, position: float, target: float, max_position: float
    ) -> list[Quote]:
        """The bid and ask the strategy wants resting now, buy first; sizes in base units, as the
        engine reports them (the strategy gets them in lots)."""
        bid_lots, bid_t, ask_lots, ask_t = registry.quote(
            self.kind,
            as_levels(book),
            self.tick,
            self.lots,
            LABEL_CODE.get(label, -1),
            int(np.rint(position / self.step)),
            target / self.step,
            lots_below(max_position, self.step),
            self.params,
        )
        out = []
        if bid_lots > 0:
            out.append(_quote("buy", at_units(bid_t, self.tick), at_units(bid_lots, self.step)))
        if ask_lots > 0:
            out.append(_quote("sell", at_units(ask_t, self.tick), at_units(ask_lots, self.step)))
        return out


def desired_quotes(
    cfg: QuoteConfig,
    contract: ContractConfig,
    book: BookSnapshot,
    *,
    label: str,
    position: float,
    target: float,
    max_position: float,
    strategy: str = "baseline",
    params: Mapping[str, float] | None = None,
) -> list[Quote]:
    """The quotes ``strategy`` wants on ``book`` (a one-off :class:`Quoter`)."""
    return Quoter(cfg, contract, strategy, params)(
        book, label=label, position=position, target=target, max_position=max_position
    )


_quote = frozen_maker(Quote)  # Quote(side, px, qty) without the frozen __init__ (two per requote)
