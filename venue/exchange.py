"""Simulated exchange (replay and live paper mode): order entry, cancel and response latency;
resting limit orders filled through a :class:`FillModel` (queue position on L2 snapshots); market and
marketable limit orders walking the book (taker, with slippage).

The exchange sees market data at exchange time (``ts_event``), the engine at local receive time;
the driver feeds both. Reports reach the engine after the response latency.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from engine.book import walk_book
from engine.clock import ReplayClock
from engine.core import PRIO_EXCH_IN, PRIO_EXCH_OUT
from engine.events import BookSnapshot, Nanos, Trade
from engine.risk import OrderIntent, reduce_only_ok
from venue.fills import EPS, FillModel, QueueState
from venue.latency import LatencyModel


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
            # The book trading through a resting order means the aggressors took it: a maker fill.
            crossed = book.ask_px[0] <= st.px if st.side == "buy" else book.bid_px[0] >= st.px
            if crossed:
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
        if book is None:
            self._report("on_reject", intent.client_oid, "no_market")
            return
        if intent.reduce_only and not reduce_only_ok(self.position, intent.side, intent.qty):
            self._report("on_reject", intent.client_oid, "reduce_only_rejected")
            return
        self._report("on_ack", intent.client_oid)
        limit = intent.px if intent.order_type == "limit" else math.nan
        # Marketable part: walk the book up to the limit (all of it for a market order).
        levels = walk_book(book, intent.side, intent.qty)
        filled = 0.0
        for px, q in levels:
            if not math.isnan(limit) and (
                (intent.side == "buy" and px > limit) or (intent.side == "sell" and px < limit)
            ):
                break
            self._report("on_fill", intent.client_oid, px, q, "taker")
            self.position += q if intent.side == "buy" else -q
            filled += q
        remaining = intent.qty - filled
        if intent.order_type == "market":
            reason = "filled" if remaining <= 1e-12 else "ioc_remainder_expired"
            self._report("on_done", intent.client_oid, reason)
        elif remaining <= 1e-12:
            self._report("on_done", intent.client_oid, "filled")
        else:
            st = QueueState(intent.client_oid, intent.side, intent.px, intent.qty, filled=filled)
            self.fill_model.on_new(st, book)
            self._resting[intent.client_oid] = st

    def _arrive_cancel(self, client_oid: str) -> None:
        r = self._resting.pop(client_oid, None)
        if r is None:
            # Already filled or unknown: the venue answers "order does not exist" (Bitget 40768/43001).
            self._report("on_reject", client_oid, "cancel_rejected:order_not_found")
            return
        self._report("on_cancel_ack", client_oid)

    def _fill(self, st: QueueState, px: float, qty: float, liquidity: str) -> None:
        qty = round(qty, 12)
        st.filled += qty
        self.position += qty if st.side == "buy" else -qty
        self._report("on_fill", st.client_oid, px, qty, liquidity)
        if st.remaining <= EPS:
            del self._resting[st.client_oid]
            self._report("on_done", st.client_oid, "filled")
