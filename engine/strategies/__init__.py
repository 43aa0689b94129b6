"""Strategies: how the engine quotes, as compiled functions of one fixed signature.

Every strategy is a module here with a ``NAME``, its parameters ``PARAMS`` (:class:`Param`) and::

    @njit
    def quote(book, tick, qty, label, position, target, max_position, params):
        return bid_lots, bid_ticks, ask_lots, ask_ticks

In the core's integer units: prices in whole ticks of the contract's ``tick``, sizes in whole lots of
its size step. ``book``: the 60-float book of :mod:`engine.book` (bid px 0..14, bid sz 15..29, ask px
30..44, ask sz 45..59, NaN where a level is missing), the exchange's prices and sizes
(``engine.contract.tick_index`` gives a price's ticks); ``tick``: the contract's price step; ``qty``:
the configured quote size, lots; ``label``: Laya's label as its class index (``engine.events.Label``);
``position``: the engine's position, lots; ``target``: Kev's target position in lots (0 without fresh
advice; it may fall between two lots); ``max_position``: the risk limit, whole lots; ``params``:
float64, the strategy's parameters in ``PARAMS`` order (then zeros). It returns the size and price of
the bid it wants resting, and of the ask (lots 0: no quote on that side). The engine keeps or replaces
its resting orders to match, and every order still passes the risk gateway.

:mod:`engine.strategies.registry` names every strategy by a kind code and compiles its C entry, which the
core calls by address (:mod:`engine.strategies.call`), so the replay kernel, the per-event replay and
live mode run the same function, and an edited strategy does not recompile the core (docs/STRATEGY.md).
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
