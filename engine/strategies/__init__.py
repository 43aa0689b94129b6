"""Strategies: how the engine quotes, as compiled functions of one fixed signature.

Every strategy is a module here with a ``NAME``, its parameters ``PARAMS`` (:class:`Param`) and::

    @njit
    def quote(book, tick, qty, label, position, target, max_position, params):
        return want_buy, bid_px, want_sell, ask_px

``book``: the 60-float book of :mod:`engine.book` (bid px 0..14, bid sz 15..29, ask px 30..44, ask sz
45..59, NaN where a level is missing); ``tick``: the contract's price step; ``qty``: the quote size;
``label``: Laya's label as its class index (``engine.events.Label``); ``position``: the engine's
position; ``target``: Kev's target position (0 without fresh advice); ``max_position``: the risk
limit; ``params``: float64, the strategy's parameters in ``PARAMS`` order (then zeros). It returns
whether it wants a bid and at what price, and the same for the ask (a price is NaN where no quote is
wanted). The engine keeps or replaces its resting orders to match, and every order still passes the
risk gateway.

:mod:`engine.strategies.registry` compiles every strategy into the core and dispatches by a kind code,
so the replay kernel, the per-event replay and live mode run the same function (docs/STRATEGY.md).
"""

from __future__ import annotations

from typing import NamedTuple


class Param(NamedTuple):
    """A strategy parameter: its default and the closed range ``[lo, hi]`` a value must lie in."""

    name: str
    default: float
    lo: float
    hi: float
    doc: str = ""
