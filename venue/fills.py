"""Fill models: how much of a resting limit order public trades and book changes fill.

Hooks are named for market events (as hftbacktest's ``QueueModel``): ``on_new`` when the order
reaches the exchange, ``on_trade`` for every public trade, ``on_depth`` for every book snapshot.
Per-order state is a small typed dataclass (:class:`QueueState`) owned by the exchange simulator.

Queue position on L2 snapshots (Rigtorp 2013, as hftbacktest's ``ProbQueueModel``): an order joins
behind the displayed size at its price; trades at that price eat the queue ahead first; a size
decrease not explained by trades is split between ahead and behind by ``prob(front, back)``. Our own
order is not in the recorded book, so displayed sizes exclude it. A price that left the 15-level
window (the book moved away) keeps its estimate; a price inside the window whose level vanished was
really emptied, so nothing is left ahead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from engine.events import BOOK_LEVELS, BookSnapshot, Trade

EPS: Final = 1e-12


@dataclass(slots=True)
class QueueState:
    client_oid: str
    side: str  # "buy" | "sell"
    px: float
    qty: float
    filled: float = 0.0
    ahead: float = 0.0  # displayed quantity estimated ahead of us at our price
    level_qty: float = math.nan  # displayed quantity at our price in the last snapshot (NaN: unknown)
    traded_at_px: float = 0.0  # trade volume at our price since the last snapshot

    @property
    def remaining(self) -> float:
        return self.qty - self.filled


def level_qty(book: BookSnapshot, side: str, px: float) -> float | None:
    """Displayed size at ``px`` on our side of ``book``.

    0.0 when ``px`` is inside the window but has no level (emptied, or better than the best price);
    None when ``px`` is beyond the deepest displayed level (it left the window: unknown).
    """
    prices, sizes = (book.bid_px, book.bid_sz) if side == "buy" else (book.ask_px, book.ask_sz)
    half_tick = 1e-9 * max(1.0, abs(px))
    deepest = math.nan
    for i in range(BOOK_LEVELS):
        p = prices[i]
        if p != p:  # NaN: fewer levels than the window holds, the whole side is visible
            return 0.0
        if abs(p - px) <= half_tick:
            return sizes[i]
        deepest = p
    beyond = px < deepest if side == "buy" else px > deepest
    return None if beyond else 0.0


def _opposite(side: str, trade: Trade) -> bool:
    return (side == "buy" and trade.side == "sell") or (side == "sell" and trade.side == "buy")


def _through(side: str, px: float, trade_px: float) -> bool:
    return trade_px < px if side == "buy" else trade_px > px


def _at(px: float, trade_px: float) -> bool:
    return abs(px - trade_px) <= 1e-9 * max(1.0, abs(px))


class FillModel(Protocol):
    name: str

    def on_new(self, st: QueueState, book: BookSnapshot | None) -> None: ...

    def on_trade(self, st: QueueState, trade: Trade) -> float: ...

    def on_depth(self, st: QueueState, book: BookSnapshot) -> None: ...


class TouchFillModel:
    """Optimistic: a trade at or through our price fills us up to its size (no queue ahead)."""

    name = "touch"

    def on_new(self, st: QueueState, book: BookSnapshot | None) -> None:
        st.ahead = 0.0

    def on_trade(self, st: QueueState, trade: Trade) -> float:
        if _opposite(st.side, trade) and (_at(st.px, trade.px) or _through(st.side, st.px, trade.px)):
            return min(st.remaining, trade.sz)
        return 0.0

    def on_depth(self, st: QueueState, book: BookSnapshot) -> None:
        pass


class ThroughFillModel(TouchFillModel):
    """Pessimistic without queue tracking: only a trade strictly through our price fills us."""

    name = "through"

    def on_trade(self, st: QueueState, trade: Trade) -> float:
        if _opposite(st.side, trade) and _through(st.side, st.px, trade.px):
            return min(st.remaining, trade.sz)
        return 0.0


def power_prob(n: float) -> Callable[[float, float], float]:
    """f(x) = x**n; prob = f(back) / (f(back) + f(front)) (hftbacktest PowerProbQueueFunc)."""

    def prob(front: float, back: float) -> float:
        fb, ff = back**n, front**n
        return fb / (fb + ff) if fb + ff > 0 else 1.0

    return prob


def log_prob(front: float, back: float) -> float:
    """f(x) = log(1 + x) (hftbacktest LogProbQueueFunc)."""
    fb, ff = math.log1p(back), math.log1p(front)
    return fb / (fb + ff) if fb + ff > 0 else 1.0


class QueueFillModel:
    """Queue position with trades eating the queue ahead and a probabilistic split of cancels.

    ``prob(front, back)`` is the probability that an unexplained size decrease came from behind us.
    """

    def __init__(self, prob: Callable[[float, float], float], name: str) -> None:
        self.prob = prob
        self.name = name

    def on_new(self, st: QueueState, book: BookSnapshot | None) -> None:
        q = level_qty(book, st.side, st.px) if book is not None else None
        st.ahead = q if q is not None else 0.0
        st.level_qty = q if q is not None else math.nan
        st.traded_at_px = 0.0

    def on_trade(self, st: QueueState, trade: Trade) -> float:
        if not _opposite(st.side, trade):
            return 0.0
        if _through(st.side, st.px, trade.px):
            st.ahead = 0.0
            return min(st.remaining, trade.sz)
        if not _at(st.px, trade.px):
            return 0.0
        st.traded_at_px += trade.sz
        st.ahead -= trade.sz
        if st.ahead >= 0:
            return 0.0
        filled = min(st.remaining, -st.ahead)
        st.ahead = 0.0
        return filled

    def on_depth(self, st: QueueState, book: BookSnapshot) -> None:
        q = level_qty(book, st.side, st.px)
        traded, st.traded_at_px = st.traded_at_px, 0.0
        if q is None:  # left the window: the queue is still there, we just cannot see it
            st.level_qty = math.nan
            return
        prev = st.level_qty
        st.level_qty = q
        if prev != prev:  # came back into view: all we know is that at most q is ahead
            st.ahead = min(st.ahead, q)
            return
        self._depth_change(st, prev, q, prev - q - traded)

    def _depth_change(self, st: QueueState, prev: float, q: float, chg: float) -> None:
        if chg <= 0:  # growth joins behind us
            st.ahead = min(st.ahead, q)
            return
        front = st.ahead
        back = max(prev - front, 0.0)
        p = self.prob(front, back)
        if not math.isfinite(p):
            p = 1.0
        est = front - (1.0 - p) * chg + min(back - p * chg, 0.0)
        st.ahead = max(0.0, min(est, q))


class RiskAverseQueueModel(QueueFillModel):
    """Conservative: cancels are always behind us; only trades move us forward."""

    def __init__(self) -> None:
        super().__init__(lambda front, back: 1.0, "risk_averse")

    def _depth_change(self, st: QueueState, prev: float, q: float, chg: float) -> None:
        st.ahead = max(0.0, min(st.ahead, q))


FILL_MODELS: Final[dict[str, Callable[[], FillModel]]] = {
    "touch": TouchFillModel,
    "through": ThroughFillModel,
    "queue_power2": lambda: QueueFillModel(power_prob(2.0), "queue_power2"),
    "queue_power3": lambda: QueueFillModel(power_prob(3.0), "queue_power3"),
    "queue_log": lambda: QueueFillModel(log_prob, "queue_log"),
    "risk_averse": RiskAverseQueueModel,
}
