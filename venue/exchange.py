"""The simulated exchange as Python drives it one event at a time (the per-event replay, live paper
mode, the local Bitget exchange): order entry, cancel and response latency around the one compiled
venue of ``venue/kernel.py``, which the replay's compiled loop runs too.

The exchange sees market data at exchange time (``ts_event``), the engine at local receive time;
the driver feeds both. Reports reach the engine after the response latency.

:class:`SimExchange` holds the venue's state in arrays of its own, laid out as the engine's (an order
table, a resting list, a timer heap for what it reports), and does only what the compiled loop does
differently: it names orders by their client ids, draws latencies from any Python model (so the
compiled draw table it hands the venue holds zeros), and puts each report on a Python clock.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from engine import kernel as K
from engine.book import LEVELS, as_levels
from engine.clock import ReplayClock
from engine.contract import NO_PX, ContractConfig, lots_of, step_parts, tick_index, tick_parts
from engine.core import PRIO_EXCH_IN, PRIO_EXCH_OUT
from engine.events import BookSnapshot, Nanos, Trade
from engine.latency.models import LatencyModel
from engine.risk import OrderIntent
from venue.fills import FILL_MODELS, SIDE_CODE, FillModel
from venue.kernel import x_arrive, x_arrive_cancel, x_on_book, x_on_trade

_TYPE_CODE = {"limit": K.LIMIT, "market": K.MARKET}
_LIQUIDITY = {K.LIQ_MAKER: "maker", K.LIQ_TAKER: "taker"}
_METHOD = {
    K.M_ACK: "on_ack",
    K.M_REJECT: "on_reject",
    K.M_CANCEL_ACK: "on_cancel_ack",
    K.M_DONE: "on_done",
    K.M_FILL: "on_fill",
}


class SimExchange:
    @classmethod
    def simulated(
        cls,
        clock: ReplayClock,
        fill_model: str,
        latencies: tuple[LatencyModel, LatencyModel, LatencyModel],
        contract: ContractConfig,
    ) -> SimExchange:
        """The simulated venue of one instrument, as replay and paper live both build it: the named
        fill model (venue.fills.FILL_MODELS), the order entry, response and cancel latency models, and
        the instrument's contract (lots of its size step, prices in whole ticks)."""
        entry, response, cancel = latencies
        return cls(
            clock,
            fill_model=FILL_MODELS[fill_model](),
            entry_latency=entry,
            response_latency=response,
            cancel_latency=cancel,
            size_step=contract.size_step,
            tick=contract.tick,
        )

    def __init__(
        self,
        clock: ReplayClock,
        *,
        fill_model: FillModel,
        entry_latency: LatencyModel,
        response_latency: LatencyModel,
        cancel_latency: LatencyModel | None = None,
        size_step: float,
        tick: float,
    ) -> None:
        self.clock = clock
        self.fill_model = fill_model
        self.entry_latency = entry_latency
        self.response_latency = response_latency
        self.cancel_latency = cancel_latency or entry_latency
        self.engine: Any = None  # set by the driver: receives on_ack/on_fill/...
        self.book: BookSnapshot | None = None
        self.S = np.zeros(K.S_SIZE, dtype=np.int64)
        self.C = np.zeros(K.C_SIZE, dtype=np.int64)
        self.CF = np.zeros(K.CF_SIZE)
        self.C[K.C_FILL_MODEL] = fill_model.kind
        self.CF[K.CF_QUEUE_N] = fill_model.n
        self.CF[K.CF_SIZE_STEP] = size_step  # the venue fills in whole lots of it
        self.C[K.C_STEP_NUM], self.C[K.C_STEP_DEC] = step_parts(size_step)
        self.CF[K.CF_TICK] = tick  # and matches prices in whole ticks of this
        self.C[K.C_TICK_NUM], self.C[K.C_PX_DECIMALS] = tick_parts(tick)
        self._lpx = np.empty(LEVELS)
        self._lq = np.empty(LEVELS)
        # Orders by slot: a slot is an order's row (the venue finds order N in row N & (rows - 1), so a
        # slot below the row count is its own row); freed when the venue is done with the order.
        self.OI = np.zeros((0, K.OI_COLS), dtype=np.int64)
        self.OF = np.zeros((0, K.OF_COLS))
        self._names: list[str | None] = []  # client id by slot (None: free)
        self._slots: dict[str, int] = {}  # slot by client id, while the venue may still name the order
        self._free: list[int] = []
        self._arriving: set[int] = set()  # slots of orders on their way in (entry latency)
        self._orders(8)
        self._rests(8)
        self._compile()

    def _compile(self) -> None:
        """Load (or, on a fresh checkout, compile) every entry of the venue now, on scratch copies of
        its state: a paper or local venue's first order must not stall its loop for the compiler."""
        S, OI, OF, HI, HF, olat, rest = (
            a.copy() for a in (self.S, self.OI, self.OF, self.HI, self.HF, self.olat, self.rest)
        )
        book = np.full(4 * LEVELS, np.nan)
        x_on_book(S, self.C, self.CF, OI, OF, K.Heap(HI, HF), olat, rest, book)
        x_on_trade(S, self.C, self.CF, OI, OF, K.Heap(HI, HF), olat, rest, math.nan, 0.0, -1)
        x_arrive(
            S, self.C, self.CF, OI, OF, K.Heap(HI, HF), olat, rest, book, 0, self._lpx.copy(), self._lq.copy()
        )
        x_arrive_cancel(S, self.C, OI, K.Heap(HI, HF), olat, rest, 0)

    # ---------------------------------------------------------- state

    def _orders(self, rows: int) -> None:
        """Room for ``rows`` orders (a power of two); the slots in use keep their rows."""
        old = self.OI.shape[0]
        for name in ("OI", "OF"):
            a = getattr(self, name)
            b = np.zeros((rows, a.shape[1]), dtype=a.dtype)
            b[:old] = a
            setattr(self, name, b)
        self._names += [None] * (rows - old)
        self._free += range(rows - 1, old - 1, -1)  # the lowest slot is taken first

    def _rests(self, cap: int) -> None:
        """Room for ``cap`` resting orders (the list and its scratch half), and for what one call can
        report: each resting order a fill and a done, an arriving one an ack, a fill per level and a done."""
        rest = np.zeros(2 * cap, dtype=np.int64)
        if hasattr(self, "rest"):
            rest[: self.rest.shape[0] // 2] = self.rest[: self.rest.shape[0] // 2]
        self.rest = rest
        rows = 2 * cap + LEVELS + 2
        self.HI = np.zeros((rows, K.HI_COLS), dtype=np.int64)
        self.HF = np.zeros((rows, K.HF_COLS))
        self.heap = K.Heap(self.HI, self.HF)  # as the simulated venue's compiled steps take them
        # The venue draws each report's latency from this table: zeros, as the report's real latency is
        # drawn here, from the Python model, when the report is put on the clock.
        self.olat = np.zeros((3, rows), dtype=np.int64)

    def _slot(self, client_oid: str) -> int:
        if not self._free:
            self._orders(2 * self.OI.shape[0])
        i = self._free.pop()
        self.OI[i] = 0
        self.OF[i] = 0.0
        self._names[i] = client_oid
        self._slots[client_oid] = i
        return i

    @property
    def position(self) -> float:
        """The account's position as the venue knows it (fills as they happen, before any report
        latency): what a reduce-only order is checked against."""
        return K.size_of(self.S[K.S_XPOS], self.C)

    @property
    def resting(self) -> bool:
        """Whether any order rests on the book: without one, :meth:`on_trade` does nothing (a replay
        need not even build the trade)."""
        return bool(self.S[K.S_NREST])

    def resting_orders(self) -> list[dict[str, Any]]:
        """The resting orders in arrival order, with their queue state (fill model's estimate)."""
        out = []
        for i in self.rest[: self.S[K.S_NREST]].tolist():
            oi, of = self.OI[i], self.OF[i]
            out.append(
                {
                    "client_oid": self._names[i],
                    "side": "buy" if oi[K.OI_SIDE] == K.BUY else "sell",
                    "px": K.price_of(oi[K.OI_PX], self.C),
                    "qty": K.size_of(oi[K.OI_LOTS], self.C),
                    "filled": K.size_of(oi[K.OI_XFILLED], self.C),
                    "ahead": float(of[K.OF_AHEAD]),
                    "level_qty": float(of[K.OF_LEVEL]),
                    "traded_at_px": float(of[K.OF_TRADED]),
                }
            )
        return out

    def drop_resting(self) -> int:
        """Forget every resting order, reporting nothing (paper live's shutdown: its orders never
        reached a venue); how many there were."""
        n = int(self.S[K.S_NREST])
        for i in self.rest[:n].tolist():
            self.OI[i, K.OI_RESTING] = 0
            self._release(i)
        self.S[K.S_NREST] = 0
        return n

    # ---------------------------------------------------------- engine -> exchange

    def submit(self, intent: OrderIntent, now_ns: Nanos) -> None:
        i = self._slot(intent.client_oid)
        self.OI[i, K.OI_OID] = i
        self.OI[i, K.OI_SIDE] = SIDE_CODE[intent.side]
        self.OI[i, K.OI_TYPE] = _TYPE_CODE[intent.order_type]
        self.OI[i, K.OI_REDUCE] = intent.reduce_only
        # Whole ticks: an order reaches the venue through the risk gateway (the engine's) or the local
        # exchange's checks, both of which refuse a price off the tick grid
        limit = intent.order_type == "limit"
        self.OI[i, K.OI_PX] = int(tick_index(intent.px, self.CF[K.CF_TICK])) if limit else NO_PX
        self.OI[i, K.OI_LOTS] = lots_of(intent.qty, self.CF[K.CF_SIZE_STEP])  # down to whole lots
        self._arriving.add(i)
        at = now_ns + self.entry_latency.sample_ns(now_ns)
        self.clock.schedule(at, PRIO_EXCH_IN, partial(self._arrive, i))

    def cancel(self, client_oid: str, symbol: str, now_ns: Nanos) -> None:
        at = now_ns + self.cancel_latency.sample_ns(now_ns)
        self.clock.schedule(at, PRIO_EXCH_IN, partial(self._arrive_cancel, client_oid))

    # ---------------------------------------------------------- market data

    def on_book(self, book: BookSnapshot) -> None:
        self.book = book
        S = self.S
        S[K.S_XBOOK] = 1
        if not S[K.S_NREST]:
            return
        S[K.S_NOW] = self.clock.now_ns()
        x_on_book(
            S,
            self.C,
            self.CF,
            self.OI,
            self.OF,
            self.heap,
            self.olat,
            self.rest,
            as_levels(book),
        )
        self._report()

    def on_trade(self, trade: Trade) -> None:
        S = self.S
        if not S[K.S_NREST]:
            return
        S[K.S_NOW] = self.clock.now_ns()
        x_on_trade(
            S, self.C, self.CF, self.OI, self.OF, self.heap, self.olat, self.rest,
            trade.px, trade.sz, SIDE_CODE.get(trade.side, -1),
        )  # fmt: skip
        self._report()

    # ---------------------------------------------------------- arrivals

    def _arrive(self, i: int) -> None:
        S = self.S
        self._arriving.discard(i)
        if S[K.S_NREST] >= self.rest.shape[0] // 2:  # room for it to rest
            self._rests(self.rest.shape[0])
        S[K.S_NOW] = self.clock.now_ns()
        book = as_levels(self.book) if self.book is not None else np.full(60, np.nan)
        x_arrive(
            S, self.C, self.CF, self.OI, self.OF, self.heap, self.olat, self.rest, book, i,
            self._lpx, self._lq,
        )  # fmt: skip
        self._report()
        if not self.OI[i, K.OI_RESTING]:
            self._release(i)

    def _arrive_cancel(self, client_oid: str) -> None:
        # An order the venue no longer knows (filled, refused, never sent) gets a slot for its refusal.
        i = self._slots.get(client_oid)
        if i is None:
            i = self._slot(client_oid)
        S = self.S
        S[K.S_NOW] = self.clock.now_ns()
        x_arrive_cancel(S, self.C, self.OI, self.heap, self.olat, self.rest, i)
        self._report()
        if not self.OI[i, K.OI_RESTING] and i not in self._arriving:
            self._release(i)

    def _release(self, i: int) -> None:
        name = self._names[i]
        if name is None:  # already free (an arrival filled in full was reported done)
            return
        self._names[i] = None
        if self._slots.get(name) == i:
            del self._slots[name]
        self._free.append(i)

    # ---------------------------------------------------------- reports

    def _report(self) -> None:
        """Put what the venue reported in its last call on the clock, in the order it made them, each
        after its response latency; orders it finished leave."""
        S = self.S
        n = int(S[K.S_HEAP_N])
        if not n:
            return
        S[K.S_HEAP_N] = 0
        S[K.S_OLAT_USED + K.OLAT_RESPONSE] = 0
        HI, HF = self.HI[:n], self.HF[:n]
        engine, names, lat, clock = self.engine, self._names, self.response_latency, self.clock
        done = []
        for r in np.argsort(HI[:, 2]).tolist():  # by seq: the order they were made in
            (
                _,
                _,
                _,
                _,
                i,
                code,
                now,
            ) = HI[r].tolist()
            f1, f2 = HF[r].tolist()
            m, arg = code & 0xFF, code >> 8
            oid = names[i]
            if m == K.M_FILL:
                args: tuple[Any, ...] = (oid, f1, f2, _LIQUIDITY[arg])
            elif m == K.M_REJECT or m == K.M_DONE:
                args = (oid, K.REASON_TEXT[arg])
            else:
                args = (oid,)
            if m == K.M_DONE:
                done.append(i)
            clock.schedule(
                now + lat.sample_ns(now), PRIO_EXCH_OUT, partial(getattr(engine, _METHOD[m]), *args, now)
            )
        for i in done:
            self._release(i)
