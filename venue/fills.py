"""Fill models: how much of a resting limit order public trades and book changes fill.

Hooks are named for market events (as hftbacktest's ``QueueModel``): ``on_new`` when the order
reaches the exchange, ``on_trade`` for every public trade, ``on_depth`` for every book snapshot.
Prices here are whole ticks (:func:`engine.contract.tick_index`): an order's price, the book's levels and
a trade's price are compared as integers, so "at our price" is equality, not a tolerance.

The models are a closed set of kind codes (``FM_*``) and the rules are written once, compiled: a pure
:func:`prob` and the small state updates :func:`on_new`, :func:`on_trade`, :func:`on_depth` over a
per-order state of three floats (ahead, level, traded) passed in and returned. The replay kernel keeps
that state in its order table and calls them directly; :class:`SimExchange` (live paper mode and the
general replay path) calls them through :class:`FillModel` over a :class:`QueueState`.

Queue position on L2 snapshots (Rigtorp 2013, as hftbacktest's ``ProbQueueModel``): an order joins
behind the displayed size at its price; trades at that price eat the queue ahead first; a size
decrease not explained by trades is split between ahead and behind by ``prob(front, back)``. Our own
order is not in the recorded book, so displayed sizes exclude it. A price that left the 15-level
window (the book moved away) keeps its estimate; a price inside the window whose level vanished was
really emptied, so nothing is left ahead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Final

from engine.book import ASK_PX, BID_PX, LEVELS, SIDE_BUY, SIDE_SELL, as_levels
from engine.contract import tick_index
from engine.errors import DualhubError
from engine.events import BookSnapshot, Trade
from engine.exact import pmax, pmin
from engine.jit import njit

EPS: Final = 1e-12
# Model kinds. FM_QUEUE_POWER takes its power as the parameter ``n``.
FM_TOUCH, FM_THROUGH, FM_QUEUE_POWER, FM_QUEUE_LOG, FM_RISK_AVERSE = 0, 1, 2, 3, 4


@njit
def level_size(bk, side, px, tick) -> tuple[bool, float]:
    """(known, displayed size at ``px`` (whole ticks of ``tick``) on ``side`` of the 60-float book ``bk``).

    Size 0.0 when ``px`` is inside the window but has no level (emptied, or better than the best price);
    not known when ``px`` is beyond the deepest displayed level (it left the window)."""
    off = BID_PX if side == SIDE_BUY else ASK_PX
    deepest = math.nan
    for i in range(LEVELS):
        p = tick_index(bk[off + i], tick)
        if p != p:  # NaN: fewer levels than the window holds, the whole side is visible
            return True, 0.0
        if p == px:
            return True, bk[off + LEVELS + i]
        deepest = p
    beyond = px < deepest if side == SIDE_BUY else px > deepest
    return not beyond, 0.0


@njit(inline="always")
def _log1p(x: float) -> float:
    """C's ``log1p``, also where Python's raises (a size ahead of -1 or below, from a negative displayed
    size): -inf at -1, NaN below."""
    if x > -1.0:
        return math.log1p(x)
    return -math.inf if x == -1.0 else math.nan


@njit
def prob(kind, n, front, back) -> float:
    """The probability that an unexplained size decrease came from behind us: f(back) / (f(back) +
    f(front)) with f(x) = x**n (hftbacktest PowerProbQueueFunc) or log(1 + x) (LogProbQueueFunc);
    1.0 for the other kinds and when both sides are empty."""
    if kind == FM_QUEUE_POWER:
        fb = back**n
        ff = front**n
    elif kind == FM_QUEUE_LOG:
        fb = _log1p(back)
        ff = _log1p(front)
    else:
        return 1.0
    return fb / (fb + ff) if fb + ff > 0 else 1.0


@njit
def on_new(kind, bk, side, px, tick) -> tuple[float, float, float]:
    """The state (ahead, level, traded) of an order that starts resting at ``px`` (ticks of ``tick``) on
    book ``bk``: behind the displayed size for the queue kinds, first in line for touch and through."""
    if kind == FM_TOUCH or kind == FM_THROUGH:
        return 0.0, math.nan, 0.0
    known, q = level_size(bk, side, px, tick)
    if known:
        return q, q, 0.0
    return 0.0, math.nan, 0.0


@njit
def on_trade(kind, side, px, remaining, ahead, traded, tpx, tsz, tside) -> tuple[float, float, float]:
    """A public trade (``tpx`` in ticks, ``tsz``, aggressor ``tside``; any other code is neither side)
    against our order at ``px`` ticks: (quantity it fills, ahead, traded). Touch fills on a trade at or
    through our price, through only strictly through it; the queue kinds fill through at once and at
    our price only what the trade leaves after the queue ahead."""
    if not ((side == SIDE_BUY and tside == SIDE_SELL) or (side == SIDE_SELL and tside == SIDE_BUY)):
        return 0.0, ahead, traded
    through = tpx < px if side == SIDE_BUY else tpx > px
    at = tpx == px
    if kind == FM_TOUCH or kind == FM_THROUGH:
        if through or (at and kind == FM_TOUCH):
            return pmin(remaining, tsz), ahead, traded
        return 0.0, ahead, traded
    if through:
        return pmin(remaining, tsz), 0.0, traded
    if not at:
        return 0.0, ahead, traded
    traded += tsz
    ahead -= tsz
    if ahead >= 0:
        return 0.0, ahead, traded
    return pmin(remaining, -ahead), 0.0, traded


@njit
def on_depth(kind, n, bk, side, px, tick, ahead, level, traded) -> tuple[float, float, float]:
    """A new book snapshot ``bk``: the state (ahead, level, traded) after it of an order at ``px`` ticks
    of ``tick``. Trades at our price since the last snapshot explain that much of a decrease; the rest
    is split by :func:`prob` (never ahead of us for risk averse); growth joins behind us."""
    if kind == FM_TOUCH or kind == FM_THROUGH:
        return ahead, level, traded
    known, q = level_size(bk, side, px, tick)
    if not known:  # left the window: the queue is still there, we just cannot see it
        return ahead, math.nan, 0.0
    if level != level:  # came back into view: all we know is that at most q is ahead
        return pmin(ahead, q), q, 0.0
    chg = level - q - traded
    if kind == FM_RISK_AVERSE:
        return pmax(0.0, pmin(ahead, q)), q, 0.0
    if chg <= 0:
        return pmin(ahead, q), q, 0.0
    back = pmax(level - ahead, 0.0)
    p = prob(kind, n, ahead, back)
    if not math.isfinite(p):
        p = 1.0
    est = ahead - (1.0 - p) * chg + pmin(back - p * chg, 0.0)
    return pmax(0.0, pmin(est, q)), q, 0.0


# ---------------------------------------------------------------- over BookSnapshot / Trade / QueueState

SIDE_CODE: Final = {"buy": SIDE_BUY, "sell": SIDE_SELL}


def level_qty(book: BookSnapshot, side: str, px: float, tick: float) -> float | None:
    """:func:`level_size` on ``book`` at the price ``px`` of a contract whose tick is ``tick``; None when
    ``px`` left the window (unknown)."""
    known, q = level_size(as_levels(book), SIDE_CODE[side], tick_index(px, tick), tick)
    return float(q) if known else None


@dataclass(slots=True)
class QueueState:
    client_oid: str
    side: str  # "buy" | "sell"
    px: float
    qty: float
    tick: float  # the contract's: the models compare prices in whole ticks of it
    filled: float = 0.0
    ahead: float = 0.0  # displayed quantity estimated ahead of us at our price
    level_qty: float = math.nan  # displayed quantity at our price in the last snapshot (NaN: unknown)
    traded_at_px: float = 0.0  # trade volume at our price since the last snapshot

    @property
    def remaining(self) -> float:
        return self.qty - self.filled


class FillModel:
    """A model kind (``FM_*``, with the power ``n`` of FM_QUEUE_POWER) over :class:`QueueState`."""

    __slots__ = ("name", "kind", "n")

    def __init__(self, name: str, kind: int, n: float = 0.0) -> None:
        self.name = name
        self.kind = kind
        self.n = n

    def on_new(self, st: QueueState, book: BookSnapshot) -> None:
        st.ahead, st.level_qty, st.traded_at_px = on_new(
            self.kind, as_levels(book), SIDE_CODE[st.side], tick_index(st.px, st.tick), st.tick
        )

    def on_trade(self, st: QueueState, trade: Trade) -> float:
        filled, st.ahead, st.traded_at_px = on_trade(
            self.kind,
            SIDE_CODE[st.side],
            tick_index(st.px, st.tick),
            st.qty - st.filled,
            st.ahead,
            st.traded_at_px,
            tick_index(trade.px, st.tick),
            trade.sz,
            SIDE_CODE.get(trade.side, -1),
        )
        return filled

    def on_depth(self, st: QueueState, book: BookSnapshot) -> None:
        st.ahead, st.level_qty, st.traded_at_px = on_depth(
            self.kind,
            self.n,
            as_levels(book),
            SIDE_CODE[st.side],
            tick_index(st.px, st.tick),
            st.tick,
            st.ahead,
            st.level_qty,
            st.traded_at_px,
        )


FILL_MODELS: Final = {
    "touch": partial(FillModel, "touch", FM_TOUCH),
    "through": partial(FillModel, "through", FM_THROUGH),
    "queue_power2": partial(FillModel, "queue_power2", FM_QUEUE_POWER, 2.0),
    "queue_power3": partial(FillModel, "queue_power3", FM_QUEUE_POWER, 3.0),
    "queue_log": partial(FillModel, "queue_log", FM_QUEUE_LOG),
    "risk_averse": partial(FillModel, "risk_averse", FM_RISK_AVERSE),
}


def check_fill_model(name: str) -> None:
    """One line naming the known fill models when ``name`` is none of them (replay and paper alike)."""
    if name not in FILL_MODELS:
        raise DualhubError(f"unknown fill model {name!r}; known: {', '.join(FILL_MODELS)}")
