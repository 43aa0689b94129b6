"""Simulated exchange (replay and live paper mode): order entry, cancel and response latency;
resting limit orders filled through a :class:`FillModel` (queue position on L2 snapshots); market and
marketable limit orders walking the book (taker, with slippage).

The exchange sees market data at exchange time (``ts_event``), the engine at local receive time;
the driver feeds both. Reports reach the engine after the response latency.

The matching arithmetic (:func:`match_arrival`, :func:`crossed`, :func:`maker_fill`) is compiled and
shared with the replay kernel, which runs the same venue over its own tables.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine.book import LEVELS, SIDE_BUY, SIDE_SELL, as_levels, walk_levels
from engine.clock import ReplayClock
from engine.core import PRIO_EXCH_IN, PRIO_EXCH_OUT
from engine.events import BookSnapshot, Nanos, Trade
from engine.exact import pyround
from engine.jit import njit
from engine.risk import OrderIntent, reduce_only_ok
from venue.fills import EPS, SIDE_CODE, FillModel, QueueState
from venue.latency import LatencyModel

# What an arriving order does after its marketable part.
AR_REST, AR_FILLED, AR_IOC_EXPIRED = 0, 1, 2


@njit
def match_arrival(bk, side, qty, limit, market, position, lpx, lq) -> tuple[int, float, float, int]:
    """An order arriving on book ``bk``: the levels it takes (into ``lpx``/``lq``: the book walked up to
    ``limit``, all of it when NaN), and (levels taken, filled, the venue's position after, AR_*).
    A market order's unfilled rest expires (IOC); a limit order's rests on the book."""
    n = walk_levels(bk, side, qty, lpx, lq)
    filled = 0.0
    for j in range(n):
        px = lpx[j]
        if limit == limit and ((side == SIDE_BUY and px > limit) or (side == SIDE_SELL and px < limit)):
            n = j
            break
        position += lq[j] if side == SIDE_BUY else -lq[j]
        filled += lq[j]
    if qty - filled <= EPS:
        return n, filled, position, AR_FILLED
    return n, filled, position, AR_IOC_EXPIRED if market else AR_REST


@njit
def crossed(side, px, best_bid, best_ask) -> bool:
    """The book traded through a resting order at ``px``: the aggressors took it (a maker fill)."""
    return best_ask <= px if side == SIDE_BUY else best_bid >= px


@njit
def maker_fill(side, qty, filled, position, q) -> tuple[float, float, float, bool]:
    """A maker fill of ``q`` on a resting order of ``qty`` with ``filled`` done: (the fill's quantity,
    filled after, the venue's position after, whether the order is done). The quantity is rounded to 12
    digits, so partial fills of sizes like 0.1 + 0.2 sum to the size."""
    r = pyround(q, 12)
    filled += r
    position += r if side == SIDE_BUY else -r
    return r, filled, position, qty - filled <= EPS


class SimExchange:
    def __init__(
        self,
        clock: ReplayClock,
        *,
        fill_model: FillModel,
        entry_latency: LatencyModel,
        response_latency: LatencyModel,
        cancel_latency: LatencyModel | None = None,
    ) -> None:
        self.clock = clock
        self.fill_model = fill_model
        self.entry_latency = entry_latency
        self.response_latency = response_latency
        self.cancel_latency = cancel_latency or entry_latency
        self.engine: Any = None  # set by the driver: receives on_ack/on_fill/...
        self.book: BookSnapshot | None = None
        self._resting: dict[str, QueueState] = {}
        # The account's position as the venue knows it (fills as they happen, before any report
        # latency): what a reduce-only order is checked against.
        self.position = 0.0
        self._lpx = np.empty(LEVELS)
        self._lq = np.empty(LEVELS)

    # ---------------------------------------------------------- engine -> exchange

    def submit(self, intent: OrderIntent, now_ns: Nanos) -> None:
        at = now_ns + self.entry_latency.sample_ns(now_ns)
        self.clock.schedule(at, PRIO_EXCH_IN, partial(self._arrive, intent))

    def cancel(self, client_oid: str, symbol: str, now_ns: Nanos) -> None:
        at = now_ns + self.cancel_latency.sample_ns(now_ns)
        self.clock.schedule(at, PRIO_EXCH_IN, partial(self._arrive_cancel, client_oid))

    # ---------------------------------------------------------- market data

    def on_book(self, book: BookSnapshot) -> None:
        self.book = book
        if not self._resting:
            return
        for st in list(self._resting.values()):
            self.fill_model.on_depth(st, book)
            if crossed(SIDE_CODE[st.side], st.px, book.bid_px[0], book.ask_px[0]):
                self._fill(st, st.px, st.remaining, "maker")

    @property
    def resting(self) -> bool:
        """Whether any order rests on the book: without one, :meth:`on_trade` does nothing (a replay
        need not even build the trade)."""
        return bool(self._resting)

    def on_trade(self, trade: Trade) -> None:
        left = trade.sz
        # Deterministic order: resting orders in arrival order (dict keeps insertion order).
        for st in list(self._resting.values()):
            if left <= EPS:
                break
            q = min(self.fill_model.on_trade(st, trade), left)
            if q > EPS:
                left -= q
                self._fill(st, st.px, q, "maker")

    # ---------------------------------------------------------- matching

    def _report(self, method: str, *args: Any) -> None:
        now = self.clock.now_ns()
        at = now + self.response_latency.sample_ns(now)
        self.clock.schedule(at, PRIO_EXCH_OUT, partial(getattr(self.engine, method), *args, now))

    def _arrive(self, intent: OrderIntent) -> None:
        book = self.book
        oid = intent.client_oid
        if book is None:
            self._report("on_reject", oid, "no_market")
            return
        if intent.reduce_only and not reduce_only_ok(self.position, intent.side, intent.qty):
            self._report("on_reject", oid, "reduce_only_rejected")
            return
        self._report("on_ack", oid)
        lpx, lq = self._lpx, self._lq
        n, filled, self.position, outcome = match_arrival(
            as_levels(book),
            SIDE_CODE[intent.side],
            intent.qty,
            intent.px if intent.order_type == "limit" else math.nan,
            intent.order_type == "market",
            self.position,
            lpx,
            lq,
        )
        for j in range(n):
            self._report("on_fill", oid, float(lpx[j]), float(lq[j]), "taker")
        if outcome == AR_REST:
            st = QueueState(oid, intent.side, intent.px, intent.qty, filled=filled)
            self.fill_model.on_new(st, book)
            self._resting[oid] = st
        else:
            self._report("on_done", oid, "filled" if outcome == AR_FILLED else "ioc_remainder_expired")

    def _arrive_cancel(self, client_oid: str) -> None:
        r = self._resting.pop(client_oid, None)
        if r is None:
            # Already filled or unknown: the venue answers "order does not exist" (Bitget 40768/43001).
            self._report("on_reject", client_oid, "cancel_rejected:order_not_found")
            return
        self._report("on_cancel_ack", client_oid)

    def _fill(self, st: QueueState, px: float, qty: float, liquidity: str) -> None:
        qty, st.filled, self.position, done = maker_fill(
            SIDE_CODE[st.side], st.qty, st.filled, self.position, qty
        )
        self._report("on_fill", st.client_oid, px, qty, liquidity)
        if done:
            del self._resting[st.client_oid]
            self._report("on_done", st.client_oid, "filled")
