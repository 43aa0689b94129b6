"""One engine over several instruments: a core per instrument (``engine/kernel.py``), one clock, one
portfolio.

Each instrument keeps the state of its own quoting, orders, Kev requests and money, as a single-
instrument engine does. What makes them one engine is shared: the id counters (order ``dh-N``, Kev
request and command ids are unique across the portfolio), the output buffer (the event log's rows
stay in the order the steps ran, each naming its instrument), and the risk gateway's view of the rest
of the portfolio (``PF``: each instrument's mark, net delta, gross exposure and PnL), which the
portfolio rules of ``engine/risk.py`` read (net delta, gross exposure, loss stop over all instruments).
The operator's kill switch and flatten act on every instrument, and an EMERGENCY label of any
instrument pulls the quotes of all.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import TYPE_CHECKING

import numpy as np

from engine import kernel as K

if TYPE_CHECKING:
    from engine.core import Engine, PortfolioView


class Portfolio:
    """The instruments one engine trades: build it, then one :class:`engine.core.Engine` per instrument
    with ``portfolio=`` this (the first one built is instrument 0). Drivers hand each instrument's
    events to its engine (:meth:`engine`); the portfolio keeps them one."""

    def __init__(self, symbols: list[str] | tuple[str, ...]) -> None:
        if len(set(symbols)) != len(symbols) or not symbols:
            raise ValueError(f"a portfolio needs distinct symbols, got {list(symbols)}")
        self.symbols = tuple(symbols)
        self.PI = np.zeros(K.PI_SIZE, dtype=np.int64)
        self.PF = np.zeros((len(symbols), K.PF_COLS), dtype=np.float64)
        self.PF[:, K.PF_MARK] = math.nan  # no book yet
        self.engines: list[Engine] = []
        self._by_symbol: dict[str, Engine] = {}

    def join(self, engine: Engine) -> int:
        """``engine`` trades the next symbol; its instrument index."""
        i = len(self.engines)
        if i >= len(self.symbols) or engine.cfg.symbol != self.symbols[i]:
            raise ValueError(f"engine for {engine.cfg.symbol} joins a portfolio expecting {self.symbols}")
        self.engines.append(engine)
        self._by_symbol[engine.cfg.symbol] = engine
        return i

    def engine(self, symbol: str) -> Engine:
        return self._by_symbol[symbol]

    def emergency(self, source: Engine) -> None:
        """An EMERGENCY label on ``source``'s instrument: the others pull their quotes, in instrument
        order, at the same time."""
        for e in self.engines:
            if e is not source:
                e.pull()

    def kill(self) -> None:
        """The kill switch, on every instrument."""
        for e in self.engines:
            e.kill()

    def flatten(self) -> tuple[list[str], bool]:
        """Reduce-only market orders for every instrument's position: the client oids sent, and whether
        one was refused."""
        sent: list[str] = []
        refused = False
        for e in self.engines:
            s, r = e.flatten()
            sent += s
            refused = refused or r
        return sent, refused

    @property
    def kill_switch(self) -> bool:
        return any(e.kill_switch for e in self.engines)

    def positions(self) -> dict[str, PortfolioView]:
        return {e.cfg.symbol: e.portfolio for e in self.engines}

    def net_delta_usd(self) -> float:
        """Sum over instruments of position times mark (an instrument with no position counts 0)."""
        return float(sum(self.PF[:, K.PF_DELTA]))

    def pnl(self) -> Decimal:
        """Cash plus every position at its instrument's mark, net of fees (exact per instrument)."""
        total = Decimal(0)
        for i, e in enumerate(self.engines):
            mark = float(self.PF[i, K.PF_MARK])
            view = e.portfolio
            total += view.cash if view.position == 0 else view.pnl(mark)
        return total
