"""Simulated exchange for replay: order entry/response latency, resting limit orders filled by public
trades through a :class:`FillModel`, market (and marketable limit) orders walking the book.

The exchange's view of the market advances at each event's receive time (a feed-latency model that
separates the two is the realism issue's job). Reports reach the engine after the response latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from engine.book import walk_book
from engine.clock import ReplayClock
from engine.core import PRIO_EXCH_IN, PRIO_EXCH_OUT
from engine.events import BookSnapshot, Nanos, Trade
from engine.fills import FillModel
from engine.latency import LatencyModel
from engine.risk import OrderIntent


@dataclass
class _Resting:
    client_oid: str
    side: str
    px: float
    qty: float
    filled: float = 0.0


class SimExchange:
    def __init__(
        self,
        clock: ReplayClock,
        *,
        fill_model: FillModel,
        entry_latency: LatencyModel,
        response_latency: LatencyModel,
    ) -> None:
        self.clock = clock
        self.fill_model = fill_model
        self.entry_latency = entry_latency
        self.response_latency = response_latency
        self.engine: Any = None  # set by the driver: receives on_ack/on_fill/...
        self.book: BookSnapshot | None = None
        self._resting: dict[str, _Resting] = {}
        self._known: set[str] = set()

    # ---------------------------------------------------------- engine -> exchange

    def submit(self, intent: OrderIntent, now_ns: Nanos) -> None:
        at = now_ns + self.entry_latency.sample_ns(now_ns)
        self.clock.schedule(at, PRIO_EXCH_IN, partial(self._arrive, intent))

    def cancel(self, client_oid: str, symbol: str, now_ns: Nanos) -> None:
        at = now_ns + self.entry_latency.sample_ns(now_ns)
        self.clock.schedule(at, PRIO_EXCH_IN, partial(self._arrive_cancel, client_oid))

    # ---------------------------------------------------------- market data

    def on_book(self, book: BookSnapshot) -> None:
        self.book = book

    def on_trade(self, trade: Trade) -> None:
        left = trade.sz
        # Deterministic order: resting orders in arrival order (dict keeps insertion order).
        for r in list(self._resting.values()):
            if left <= 1e-12:
                break
            q = self.fill_model.fill_qty(r.side, r.px, r.qty - r.filled, trade, left)
            if q > 1e-12:
                left -= q
                self._fill(r, r.px, q, "maker")

    # ---------------------------------------------------------- matching

    def _report(self, method: str, *args: Any) -> None:
        now = self.clock.now_ns()
        at = now + self.response_latency.sample_ns(now)
        self.clock.schedule(at, PRIO_EXCH_OUT, partial(getattr(self.engine, method), *args, now))

    def _arrive(self, intent: OrderIntent) -> None:
        self._known.add(intent.client_oid)
        book = self.book
        if book is None:
            self._report("on_reject", intent.client_oid, "no_market")
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
            filled += q
        remaining = intent.qty - filled
        if intent.order_type == "market":
            reason = "filled" if remaining <= 1e-12 else "ioc_remainder_expired"
            self._report("on_done", intent.client_oid, reason)
        elif remaining <= 1e-12:
            self._report("on_done", intent.client_oid, "filled")
        else:
            self._resting[intent.client_oid] = _Resting(intent.client_oid, intent.side, intent.px, remaining)

    def _arrive_cancel(self, client_oid: str) -> None:
        r = self._resting.pop(client_oid, None)
        if r is None:
            # Already filled or unknown: the venue answers "order does not exist" (Bitget 40768/43001).
            self._report("on_reject", client_oid, "cancel_rejected:order_not_found")
            return
        self._report("on_cancel_ack", client_oid)

    def _fill(self, r: _Resting, px: float, qty: float, liquidity: str) -> None:
        r.filled += qty
        self._report("on_fill", r.client_oid, px, qty, liquidity)
        if r.qty - r.filled <= 1e-12:
            del self._resting[r.client_oid]
            self._report("on_done", r.client_oid, "filled")
