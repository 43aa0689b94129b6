"""Simulated exchange (replay and live paper mode): order entry, cancel and response latency;
resting limit orders filled through a :class:`FillModel` (queue position on L2 snapshots); market and
marketable limit orders walking the book (taker, with slippage).

The exchange sees market data at exchange time (``ts_event``), the engine at local receive time;
the driver feeds both. Reports reach the engine after the response latency.

The matching is compiled and shared with the replay kernel, which runs the same venue over its own
tables: an arriving order (:func:`match_arrival`), a new book over the resting orders
(:func:`book_fills`, with :func:`crossed`), a public trade shared among them (:func:`trade_fills`) and
a maker fill (:func:`maker_fill`). The two loops read the resting orders as columns (side, price,
size, filled, queue state) indexed by row: the kernel passes its order table's columns as they are,
:class:`SimExchange` copies its few :class:`QueueState` into a small table of its own for each call.
"""

from __future__ import annotations

import math
import struct
from functools import partial
from typing import Any

import numpy as np

from engine.book import ASK_PX, BID_PX, LEVELS, SIDE_BUY, SIDE_SELL, as_levels, walk_levels
from engine.clock import ReplayClock
from engine.core import PRIO_EXCH_IN, PRIO_EXCH_OUT
from engine.events import BookSnapshot, Nanos, Trade
from engine.exact import pmin, pyround
from engine.jit import njit
from engine.risk import OrderIntent, reduce_only_ok
from venue.fills import EPS, SIDE_CODE, FillModel, QueueState, on_depth, on_trade
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
def book_fills(kind, n_pow, bk, rows, n, side, px, ahead, level, traded, out) -> int:
    """A new book ``bk`` at the venue over the resting orders ``rows[:n]`` (rows of the columns
    ``side`` .. ``traded``, in arrival order): each order's queue state (``ahead``, ``level``,
    ``traded``) after it, as fill model ``kind`` (power ``n_pow``) has it; the rows of the orders the
    book traded through go to ``out`` (which may be ``rows``), in that order, and their count is
    returned. Each of those fills as maker, all that remains of it, at its price: the caller fills them
    after the loop, in that order (a fill changes nothing another order's rules read)."""
    k = 0
    for w in range(n):
        r = rows[w]
        ahead[r], level[r], traded[r] = on_depth(
            kind, n_pow, bk, side[r], px[r], ahead[r], level[r], traded[r]
        )
        if crossed(side[r], px[r], bk[BID_PX], bk[ASK_PX]):
            out[k] = r
            k += 1
    return k


@njit
def trade_fills(kind, rows, n, side, px, qty, filled, ahead, traded, tpx, tsz, tside, out, fq) -> int:
    """A public trade (``tpx``, ``tsz``, aggressor ``tside``) shared among the resting orders
    ``rows[:n]`` (rows of the columns ``side`` .. ``traded``, ``filled`` the venue's): in arrival
    order, each takes what fill model ``kind`` gives it (:func:`venue.fills.on_trade`, its queue state
    updated in ``ahead``/``traded``) out of what earlier orders left of the trade, until nothing is
    left. The maker fills go to ``out`` (their rows; may be ``rows``) and ``fq`` (their quantities,
    before :func:`maker_fill` rounds them), in that order; their count is returned. The caller makes
    them after the loop, in that order (a fill changes nothing another order's rules read)."""
    left = tsz
    k = 0
    for w in range(n):
        if left <= EPS:
            break
        r = rows[w]
        f, ahead[r], traded[r] = on_trade(
            kind, side[r], px[r], qty[r] - filled[r], ahead[r], traded[r], tpx, tsz, tside
        )
        q = pmin(f, left)
        if q > EPS:
            left -= q
            out[k] = r
            fq[k] = q
            k += 1
    return k


# SimExchange's resting orders as one float table (a row per order): the side code, then the state the
# loops read and update. One table (the side a float in it) costs one copy in from the QueueStates and
# one compiled call with few arguments: what calling the loops from Python per event can afford.
_T_SIDE, _T_PX, _T_QTY, _T_FILLED, _T_AHEAD, _T_LEVEL, _T_TRADED = range(7)
_T_COLS = 7
# A row as C doubles: struct packs Python floats straight into the table's memory and reads them back
# (exactly, as float64 holds them), several times cheaper than numpy converting them one by one.
_ROW = struct.Struct(f"={_T_COLS}d")


@njit
def _table_book_fills(kind, n_pow, bk, T, rows, n, out) -> int:
    """:func:`book_fills` over SimExchange's table."""
    return book_fills(
        kind,
        n_pow,
        bk,
        rows,
        n,
        T[:, _T_SIDE],
        T[:, _T_PX],
        T[:, _T_AHEAD],
        T[:, _T_LEVEL],
        T[:, _T_TRADED],
        out,
    )


@njit
def _table_trade_fills(kind, T, rows, n, tpx, tsz, tside, out, fq) -> int:
    """:func:`trade_fills` over SimExchange's table."""
    return trade_fills(
        kind,
        rows,
        n,
        T[:, _T_SIDE],
        T[:, _T_PX],
        T[:, _T_QTY],
        T[:, _T_FILLED],
        T[:, _T_AHEAD],
        T[:, _T_TRADED],
        tpx,
        tsz,
        tside,
        out,
        fq,
    )


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
        self._columns(8)  # grows as more orders rest

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
        sts = self._load()
        fm = self.fill_model
        k = _table_book_fills(fm.kind, fm.n, as_levels(book), self._table, self._rows, len(sts), self._out)
        for i, st in enumerate(sts):
            _, _, _, _, st.ahead, st.level_qty, st.traded_at_px = _ROW.unpack_from(self._buf, i * _ROW.size)
        if k:
            for r in self._out[:k].tolist():
                st = sts[r]
                self._fill(st, st.px, st.remaining, "maker")

    @property
    def resting(self) -> bool:
        """Whether any order rests on the book: without one, :meth:`on_trade` does nothing (a replay
        need not even build the trade)."""
        return bool(self._resting)

    def on_trade(self, trade: Trade) -> None:
        if not self._resting:
            return
        sts = self._load()
        tside = SIDE_CODE.get(trade.side, -1)
        k = _table_trade_fills(
            self.fill_model.kind,
            self._table,
            self._rows,
            len(sts),
            trade.px,
            trade.sz,
            tside,
            self._out,
            self._fq,
        )
        for i, st in enumerate(sts):
            _, _, _, _, st.ahead, _, st.traded_at_px = _ROW.unpack_from(self._buf, i * _ROW.size)
        if k:
            for r, q in zip(self._out[:k].tolist(), self._fq[:k].tolist(), strict=True):
                st = sts[r]
                self._fill(st, st.px, q, "maker")

    # ---------------------------------------------------------- resting orders as a table

    def _columns(self, cap: int) -> None:
        """Room for ``cap`` resting orders in the table the loops read (a row per order, columns _T_*),
        and in their outputs."""
        self._table = np.zeros((cap, _T_COLS))
        self._buf = memoryview(self._table).cast("B")  # the table's bytes, rows packed and read by _ROW
        self._rows = np.arange(cap, dtype=np.int64)  # the resting orders in arrival order: row w is the w-th
        self._out = np.zeros(cap, dtype=np.int64)
        self._fq = np.zeros(cap)

    def _load(self) -> list[QueueState]:
        """The resting orders in arrival order (the dict keeps it), copied into the table: row w is the
        w-th of the list returned."""
        sts = list(self._resting.values())
        if len(sts) > len(self._rows):
            self._columns(2 * len(sts))
        buf = self._buf
        for i, st in enumerate(sts):
            _ROW.pack_into(
                buf,
                i * _ROW.size,
                SIDE_CODE[st.side],
                st.px,
                st.qty,
                st.filled,
                st.ahead,
                st.level_qty,
                st.traded_at_px,
            )
        return sts

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
