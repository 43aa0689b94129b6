"""The venue's loops over its resting orders (``venue.exchange.book_fills``, ``trade_fills``) on both of
their callers: :class:`SimExchange` (live paper mode, the per-event replay) and the replay kernel's
``_x_on_book``/``_x_on_trade`` over its order table. Same orders, books and trades in; the same reports
(fills, done) and the same queue state, bit for bit, out."""

import json
import random

import numpy as np

from engine.book import SIDE_BUY, SIDE_SELL, as_levels
from engine.clock import ReplayClock
from engine.events import Trade
from engine.risk import OrderIntent
from replay import kernel as K
from tests.helpers import as_plain_python, make_book
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS
from venue.latency import ConstantLatency

SIDES = {"buy": SIDE_BUY, "sell": SIDE_SELL}
REASONS = {K.R_FILLED: "filled", K.R_IOC: "ioc_remainder_expired"}


def _trade(px, sz, side):
    return Trade(ts_event=1, ts_recv=1, seq=0, symbol="BTCUSDT", trade_id="t", px=px, sz=sz, side=side)


class _Sink:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a: self.calls.append((name, *a))


class _Sim:
    """SimExchange with no latency: each report reaches the sink as soon as the clock runs."""

    def __init__(self, model):
        self.clock = ReplayClock(0)
        zero = ConstantLatency(0)
        self.ex = SimExchange(
            self.clock, fill_model=FILL_MODELS[model](), entry_latency=zero, response_latency=zero
        )
        self.ex.engine = _Sink()

    def book(self, b):
        self.ex.on_book(b)
        self.clock.run_all()

    def trade(self, t):
        self.ex.on_trade(t)
        self.clock.run_all()

    def order(self, oid, side, px, qty):
        o = OrderIntent(
            client_oid=f"o{oid}",
            symbol="BTCUSDT",
            intent="new",
            side=side,
            order_type="limit",
            px=px,
            qty=qty,
        )
        self.ex.submit(o, self.clock.now_ns())
        self.clock.run_all()

    def reports(self):
        out = []
        for name, oid, *rest in self.ex.engine.calls:
            if name == "on_fill":
                out.append(("fill", int(oid[1:]), repr(float(rest[0])), repr(float(rest[1])), rest[2]))
            elif name == "on_done":
                out.append(("done", int(oid[1:]), rest[0]))
            else:
                out.append((name[3:], int(oid[1:])))
        return out

    def state(self):
        """Per resting order, in arrival order: (oid, filled, ahead, level, traded)."""
        out = []
        for st in self.ex._resting.values():
            values = (st.filled, st.ahead, st.level_qty, st.traded_at_px)
            out.append((int(st.client_oid[1:]), *(repr(float(x)) for x in values)))
        return out


class _Kernel:
    """The kernel's venue functions over its own tables (rows = order ids), reports read off its timer
    heap in the order they were made."""

    def __init__(self, model):
        fm = FILL_MODELS[model]()
        self.S = np.zeros(K.S_SIZE, dtype=np.int64)
        self.SF = np.zeros(K.SF_SIZE)
        self.C = np.zeros(K.C_SIZE, dtype=np.int64)
        self.C[K.C_FILL_MODEL] = fm.kind
        self.CF = np.zeros(K.CF_SIZE)
        self.CF[K.CF_QUEUE_N] = fm.n
        self.OI = np.zeros((64, K.OI_COLS), dtype=np.int64)
        self.OF = np.zeros((64, K.OF_COLS))
        self.HI = np.zeros((8192, K.HI_COLS), dtype=np.int64)
        self.HF = np.zeros((8192, K.HF_COLS))
        self.olat = np.zeros((3, 8192), dtype=np.int64)  # no latency, as _Sim
        self.rest = np.zeros(2 * K.REST_CAP, dtype=np.int64)
        self.x_book = np.full(60, np.nan)
        self.OUTI = np.zeros((8, 1, K.OUT_MAXI), dtype=np.int64)  # the venue writes no output rows
        self.OUTF = np.zeros((8, 1, K.OUT_MAXF))
        self.NOUT = np.zeros(8, dtype=np.int64)

    def _tables(self):
        return self.S, self.SF, self.C, self.CF, self.OI, self.OF, self.HI, self.HF, self.olat, self.rest

    def book(self, b):
        self.x_book[:] = as_levels(b)
        self.S[K.S_XBOOK] = 1
        K._x_on_book(*self._tables(), self.x_book, self.OUTI, self.OUTF, self.NOUT)

    def trade(self, t):
        K._x_on_trade(*self._tables(), t.px, t.sz, SIDES[t.side], self.OUTI, self.OUTF, self.NOUT)

    def order(self, oid, side, px, qty):
        self.OI[oid, K.OI_SIDE] = SIDES[side]
        self.OI[oid, K.OI_TYPE] = K.LIMIT
        self.OI[oid, K.OI_OID] = oid
        self.OF[oid, K.OF_PX] = px
        self.OF[oid, K.OF_QTY] = qty
        lpx, lq = np.zeros(16), np.zeros(16)
        K._x_arrive(*self._tables(), self.x_book, oid, self.OUTI, self.OUTF, self.NOUT, lpx, lq)

    def reports(self):
        n = self.S[K.S_HEAP_N]
        out = []
        for i in np.argsort(self.HI[:n, 2], kind="stable"):  # by seq: the order they were made in
            oid, m, arg = int(self.HI[i, 4]), int(self.HI[i, 5]) & 0xFF, int(self.HI[i, 5]) >> 8
            if m == K.M_FILL:
                liq = "maker" if arg == K.LIQ_MAKER else "taker"
                out.append(("fill", oid, repr(float(self.HF[i, 0])), repr(float(self.HF[i, 1])), liq))
            elif m == K.M_DONE:
                out.append(("done", oid, REASONS[arg]))
            else:
                out.append((("ack", "reject", "cancel_ack")[m], oid))
        return out

    def state(self):
        OF = self.OF
        cols = (K.OF_XFILLED, K.OF_AHEAD, K.OF_LEVEL, K.OF_TRADED)
        return [
            (int(o), *(repr(float(OF[o, c])) for c in cols)) for o in self.rest[: self.S[K.S_NREST]].tolist()
        ]


def _book(rng, mid):
    b = make_book(mid, round(mid + 0.1, 10), levels=rng.choice([15, 4]))
    sizes = tuple(round(rng.uniform(0.0, 2.0), 3) for _ in range(15))
    return b.__class__(**{**{f: getattr(b, f) for f in b.__slots__}, "bid_sz": sizes, "ask_sz": sizes[::-1]})


def _both(model, steps):
    """``steps`` (("book", b) / ("trade", t) / ("order", oid, side, px, qty)) through SimExchange and the
    kernel: for each, per step, (the reports it made, its resting orders' state after it)."""
    out = []
    for venue in (_Sim(model), _Kernel(model)):
        per_step, made = [], 0
        for kind, *args in steps:
            getattr(venue, kind)(*args)
            reports = venue.reports()
            per_step.append((reports[made:], venue.state()))
            made = len(reports)
        out.append(per_step)
    return out


def _random_steps(seed):
    """Books, trades and new orders at a few prices around a wandering mid: several orders rest at once,
    trades at and through their prices fill them in part."""
    rng = random.Random(seed)
    mid = 100.0
    steps = [("book", _book(rng, mid))]
    oid = 0
    for _ in range(160):
        r = rng.random()
        if r < 0.3:
            mid = round(mid + 0.1 * rng.randint(-1, 1), 10)
            steps.append(("book", _book(rng, mid)))
        elif r < 0.75:
            px = round(mid + 0.1 * rng.randint(-2, 3), 10)
            steps.append(
                ("trade", _trade(px, rng.choice([0.05, 0.3, 0.7, 2.0]), rng.choice(["buy", "sell"])))
            )
        elif oid < 60:
            side = rng.choice(["buy", "sell"])
            away = rng.randint(0, 2)
            px = round(mid - 0.1 * away if side == "buy" else mid + 0.1 + 0.1 * away, 10)
            steps.append(("order", oid, side, px, rng.choice([0.1, 0.3, 0.45, 1.2])))
            oid += 1
    return steps


def _scenario():
    """Every fill model on seeded random steps, both venues: what they reported and held (as JSON
    reads it back)."""
    return json.loads(json.dumps({model: _both(model, _random_steps(7)) for model in sorted(FILL_MODELS)}))


def test_one_trade_is_shared_in_arrival_order_and_partly_fills_the_last_order_it_reaches():
    b = make_book(100.0, 100.1, size=1.0)
    steps = [
        ("book", b),
        ("order", 0, "buy", 99.9, 0.3),
        ("order", 1, "buy", 99.9, 0.2),
        ("order", 2, "buy", 99.9, 0.4),
        ("order", 3, "sell", 100.2, 0.5),
        # through all three bids: 0.3 and 0.2 fill in full, the last gets what is left of 0.6 (0.1,
        # rounded to 12 digits from 0.6 - 0.3 - 0.2); the sell is on the aggressor's side: nothing
        ("trade", _trade(99.8, 0.6, "sell")),
        ("trade", _trade(100.2, 0.2, "buy")),  # at the sell's price, 1.0 displayed ahead of it: nothing
        ("trade", _trade(100.2, 1.1, "buy")),  # eats the 0.8 still ahead, then 0.3 of ours
        ("book", make_book(99.8, 99.85, size=1.0)),  # the ask fell through the bid: order 2's 0.3 fills
    ]
    sim, kernel = _both("queue_power2", steps)
    assert kernel == sim
    made = [[(r[0], r[1], float(r[3])) if r[0] == "fill" else r[:2] for r in reps] for reps, _ in sim[5:]]
    assert made == [
        [("fill", 0, 0.3), ("done", 0), ("fill", 1, 0.2), ("done", 1), ("fill", 2, 0.1)],
        [],
        [("fill", 3, 0.3)],
        [("fill", 2, 0.3), ("done", 2)],
    ]
    assert [s[:2] for s in sim[-1][1]] == [(3, "0.3")]  # the sell rests on, 0.2 to go


def test_the_kernel_and_sim_exchange_share_trades_and_books_alike_for_every_model():
    both = _scenario()
    for model, (sim, kernel) in both.items():
        assert kernel == sim, model
    # the steps do what the test is for: one trade filling several resting orders, the last in part
    shared = 0
    for reps, _ in both["queue_power2"][0]:
        fills = [r for r in reps if r[0] == "fill" and r[4] == "maker"]
        done = {r[1] for r in reps if r[0] == "done"}
        shared += len(fills) >= 2 and fills[-1][1] not in done
    assert shared >= 2


def test_the_loops_read_as_plain_python_give_the_compiled_reports():
    assert as_plain_python("venue.exchange.trade_fills", "tests.test_exchange._scenario") == _scenario()
