"""Queue-aware fills on L2 snapshots, checked step by step on hand-built books and trades."""

import math
import random

import numpy as np
import pytest

from engine.book import SIDE_BUY, SIDE_SELL, as_levels
from engine.clock import ReplayClock
from engine.events import Trade
from engine.latency.models import ConstantLatency
from engine.risk import OrderIntent
from tests.helpers import as_plain_python, make_book
from venue.exchange import SimExchange
from venue.fills import FILL_MODELS, FM_QUEUE_LOG, FM_QUEUE_POWER, QueueState, level_qty, prob
from venue.matching import AR_FILLED, AR_IOC_EXPIRED, AR_REST, maker_fill, match_arrival

TICK = 0.01  # the contract's tick: the books below are on its grid (100.05 is a price inside the spread)


def trade(px, sz, side="sell", ts=1):
    return Trade(ts_event=ts, ts_recv=ts, seq=0, symbol="BTCUSDT", trade_id="t", px=px, sz=sz, side=side)


def book_with(bid_sizes, bid=100.0, ask=100.1, levels=15):
    b = make_book(bid, ask, levels=levels)
    sizes = tuple(bid_sizes) + b.bid_sz[len(bid_sizes) :]
    return b.__class__(**{**{f: getattr(b, f) for f in b.__slots__}, "bid_sz": sizes})


def test_level_qty_tells_left_window_from_emptied():
    b = make_book(100.0, 100.1, size=2.0)  # bids 100.0 .. 98.6
    assert level_qty(b, "buy", 99.5, TICK) == 2.0
    assert level_qty(b, "buy", 100.05, TICK) == 0.0  # inside the spread: nothing ahead
    assert level_qty(b, "buy", 98.0, TICK) is None  # beyond the 15th level: left the window, unknown
    short = make_book(100.0, 100.1, size=2.0, levels=3)
    assert level_qty(short, "buy", 98.0, TICK) == 0.0  # the whole side is visible: really empty


def test_order_joins_behind_displayed_size_and_trades_eat_the_queue_first():
    m = FILL_MODELS["queue_power2"]()
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    m.on_new(st, book_with([1.0, 3.0]))  # 3.0 displayed at 99.9
    assert st.ahead == 3.0
    assert m.on_trade(st, trade(99.9, 2.0)) == 0.0 and st.ahead == pytest.approx(1.0)
    assert m.on_trade(st, trade(99.9, 0.8, side="buy")) == 0.0  # same-side aggressor: not against us
    filled = m.on_trade(st, trade(99.9, 1.3))  # 1.0 ahead, then 0.3 for us
    assert filled == pytest.approx(0.3) and st.ahead == 0.0


def test_trade_through_our_price_fills_at_once():
    m = FILL_MODELS["queue_power2"]()
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    m.on_new(st, book_with([1.0, 3.0]))
    assert m.on_trade(st, trade(99.8, 0.2)) == pytest.approx(0.2)


def test_unexplained_decrease_is_split_by_the_probability_model():
    m = FILL_MODELS["queue_power2"]()
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    m.on_new(st, book_with([1.0, 4.0]))
    st.ahead = 1.0  # earlier trades moved us up: 1 ahead, 3 behind
    m.on_depth(st, book_with([1.0, 2.0]))  # 4 -> 2 with no trade: 2 cancelled somewhere
    # front=1, back=3 -> p(behind) = 9/(9+1) = 0.9: est = 1 - 0.1*2 + min(3 - 0.9*2, 0) = 0.8
    assert st.ahead == pytest.approx(0.8)
    # A trade explains part of a decrease: only the rest is split.
    st.level_qty, st.ahead = 2.0, 1.0
    m.on_trade(st, trade(99.9, 0.5))  # ahead 0.5
    m.on_depth(st, book_with([1.0, 1.5]))  # 2 -> 1.5, all explained by the trade
    assert st.ahead == pytest.approx(0.5)
    conservative = FILL_MODELS["risk_averse"]()
    st2 = QueueState("o", "buy", 99.9, 0.5, TICK)
    conservative.on_new(st2, book_with([1.0, 4.0]))
    st2.ahead = 1.0
    conservative.on_depth(st2, book_with([1.0, 2.0]))
    assert st2.ahead == 1.0  # cancels are never ahead of us


def test_growth_joins_behind_and_leaving_the_window_keeps_the_estimate():
    m = FILL_MODELS["queue_log"]()
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    m.on_new(st, book_with([1.0, 2.0]))
    m.on_depth(st, book_with([1.0, 5.0]))
    assert st.ahead == 2.0
    # The book rallies 5: 99.9 is now beyond the deepest of 15 levels.
    m.on_depth(st, make_book(101.5, 101.6))
    assert st.ahead == 2.0 and math.isnan(st.level_qty)
    # The level emptied inside the window: nothing is ahead any more.
    m.on_depth(st, book_with([1.0, 0.5], bid=100.0))
    assert st.ahead == 0.5


def test_probability_curves():
    assert prob(FM_QUEUE_POWER, 2.0, 0.0, 5.0) == 1.0  # nobody ahead: every cancel is behind
    assert prob(FM_QUEUE_POWER, 2.0, 5.0, 0.0) == 0.0
    assert prob(FM_QUEUE_POWER, 2.0, 1.0, 3.0) == 0.9
    assert 0 < prob(FM_QUEUE_LOG, 0.0, 3.0, 1.0) < 0.5 < prob(FM_QUEUE_LOG, 0.0, 1.0, 3.0) < 1
    # A negative size ahead (bad data) gives C's log1p, not Python's domain error.
    assert prob(FM_QUEUE_LOG, 0.0, -1.0, 3.0) == 1.0 and prob(FM_QUEUE_LOG, 0.0, -2.0, 3.0) != 0.5


def test_touch_and_through_baselines():
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    assert FILL_MODELS["touch"]().on_trade(st, trade(99.9, 0.2)) == 0.2
    assert FILL_MODELS["through"]().on_trade(st, trade(99.9, 0.2)) == 0.0
    assert FILL_MODELS["through"]().on_trade(st, trade(99.8, 0.9)) == 0.5
    assert FILL_MODELS["touch"]().on_trade(st, trade(99.8, 0.9, side="buy")) == 0.0  # our side
    assert set(FILL_MODELS) >= {"touch", "through", "queue_power2", "queue_log", "risk_averse"}


def test_trades_elsewhere_leave_the_queue_alone_and_a_trade_through_clears_it():
    m = FILL_MODELS["queue_power2"]()
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    m.on_new(st, book_with([1.0, 3.0]))
    assert m.on_trade(st, trade(100.0, 2.0)) == 0.0  # above our bid: someone else's level
    assert m.on_trade(st, trade(99.9, 2.0, side="buy")) == 0.0  # a buyer took the asks
    assert m.on_trade(st, trade(99.9, 1.0, side="nope")) == 0.0  # no aggressor side: not against us
    assert (st.ahead, st.traded_at_px) == (3.0, 0.0)
    assert m.on_trade(st, trade(99.8, 2.0)) == 0.5  # through: all of us, capped by what is left
    assert st.ahead == 0.0
    st.filled = 0.2
    assert m.on_trade(st, trade(99.9, 1.0)) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("model", "ahead"),
    [
        # joined behind 4, 3 traded (1 ahead), 5 joined behind (6 shown), then 4 cancelled unexplained
        # (2 shown): front 1, back 5. power n: p = 5**n / (5**n + 1); est = 1 - (1 - p) * 4
        ("risk_averse", 1.0),  # cancels are never ahead of us
        ("queue_power3", 1 - 4 / 126),
        ("queue_power2", 1 - 4 / 26),
        # log: p = log 6 / (log 6 + log 2), est = 1 - (1 - p) * 4 < 0: at the front
        ("queue_log", 0.0),
    ],
)
def test_cancels_move_us_forward_as_the_model_splits_them(model, ahead):
    m = FILL_MODELS[model]()
    st = QueueState("o", "buy", 99.9, 0.5, TICK)
    m.on_new(st, book_with([1.0, 4.0]))
    assert m.on_trade(st, trade(99.9, 3.0)) == 0.0 and st.ahead == 1.0 and st.traded_at_px == 3.0
    m.on_depth(st, book_with([1.0, 6.0]))  # 4 - 3 traded + 5 new: growth, behind us
    assert (st.ahead, st.level_qty, st.traded_at_px) == (1.0, 6.0, 0.0)
    m.on_depth(st, book_with([1.0, 2.0]))
    assert st.ahead == pytest.approx(ahead, abs=1e-12)
    m.on_depth(st, book_with([1.0, 0.25]))  # never more ahead than is shown
    assert st.ahead <= 0.25 and (model != "risk_averse" or st.ahead == 0.25)


def test_touch_ignores_the_book_and_queue_kinds_start_unknown_when_the_price_left_the_window():
    st = QueueState("o", "buy", 98.0, 0.5, TICK)
    FILL_MODELS["touch"]().on_new(st, make_book(100.0, 100.1))
    FILL_MODELS["touch"]().on_depth(st, make_book(100.0, 100.1, levels=3))
    assert (st.ahead, math.isnan(st.level_qty), st.traded_at_px) == (0.0, True, 0.0)
    m = FILL_MODELS["queue_log"]()
    m.on_new(st, make_book(100.0, 100.1))  # 98.0 is beyond the 15 bid levels
    assert st.ahead == 0.0 and math.isnan(st.level_qty)
    m.on_depth(st, make_book(99.0, 99.1, size=2.0))  # back in view: at most what is shown
    assert (st.ahead, st.level_qty) == (0.0, 2.0)


def test_prices_match_as_whole_ticks_not_within_a_tolerance():
    """A fine tick on a high price: neighbouring levels are 1e-5 apart at 20 000, closer than a relative
    tolerance of 1e-9 would tell apart. In ticks each level is its own integer."""
    tick = 1e-5
    b = make_book(20_000.00003, 20_000.00004, tick=tick, size=2.0)
    b = b.__class__(**{**{f: getattr(b, f) for f in b.__slots__}, "bid_sz": (1.0, 2.0, 3.0) + b.bid_sz[3:]})
    assert [level_qty(b, "buy", px, tick) for px in (20_000.00003, 20_000.00002, 20_000.00001)] == [
        1.0,
        2.0,
        3.0,
    ]
    st = QueueState("o", "buy", 20_000.00002, 0.5, tick)
    m = FILL_MODELS["queue_power2"]()
    m.on_new(st, b)
    assert st.ahead == 2.0
    assert m.on_trade(st, trade(20_000.00003, 5.0)) == 0.0  # one tick above our bid: not at our price
    assert st.ahead == 2.0 and st.traded_at_px == 0.0
    assert m.on_trade(st, trade(20_000.00001, 0.1)) == 0.1  # one tick through it: filled


def test_the_compiled_level_lookup_reads_the_kernel_layout():
    b = book_with([1.0, 3.0])
    known, q = level_qty(b, "buy", 99.9, TICK), level_qty(b, "sell", 100.2, TICK)
    assert (known, q) == (3.0, 1.0)
    assert level_qty(b, "sell", 100.05, TICK) == 0.0 and level_qty(b, "sell", 102.0, TICK) is None


def test_marketable_limit_takes_up_to_its_price_and_rests_the_rest():
    bk = as_levels(make_book(100.0, 100.1, size=0.01))
    lpx, lq = np.empty(15), np.empty(15)
    # sizes in lots of 0.001: the book shows 10 at each level
    n, filled, pos, out = match_arrival(bk, SIDE_BUY, 50, 0.001, 1002.0, 0.1, False, 1000, lpx, lq)
    got = (n, list(lpx[:n]), list(lq[:n]), filled, pos, out)
    assert got == (2, [100.1, 100.2], [10, 10], 20, 1020, AR_REST)
    n, filled, pos, out = match_arrival(bk, SIDE_SELL, 50, 0.001, math.nan, 0.1, True, 0, lpx, lq)
    assert (n, filled, pos, out) == (5, 50, -50, AR_FILLED)
    n, filled, pos, out = match_arrival(bk, SIDE_SELL, 500, 0.001, math.nan, 0.1, True, 0, lpx, lq)
    assert (n, filled, pos, out) == (15, 150, -150, AR_IOC_EXPIRED)
    # not marketable
    n, filled, pos, out = match_arrival(bk, SIDE_SELL, 500, 0.001, 1005.0, 0.1, False, 0, lpx, lq)
    assert (n, filled, pos, out) == (0, 0, 0, AR_REST)


def test_maker_fills_count_whole_lots():
    assert maker_fill(SIDE_BUY, 300, 0, 0, 300) == (300, 300, True)
    assert maker_fill(SIDE_SELL, 500, 100, 1000, 300) == (400, 700, False)


class _Sink:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a: self.calls.append((name, *a))


def _exchange(model="queue_power2"):
    clock = ReplayClock(0)
    ex = SimExchange(
        clock,
        fill_model=FILL_MODELS[model](),
        entry_latency=ConstantLatency(10),
        response_latency=ConstantLatency(10),
        cancel_latency=ConstantLatency(30),
        size_step=0.001,
        tick=TICK,
    )
    ex.engine = _Sink()
    return clock, ex


def _run(clock):
    while clock.next_key() is not None:
        clock.pop_next()[1]()


def test_exchange_partial_fills_then_done_and_book_crossing_fills_the_rest():
    clock, ex = _exchange()
    ex.on_book(book_with([1.0, 0.4]))
    ex.submit(
        OrderIntent(
            client_oid="a", symbol="BTCUSDT", intent="new", side="buy", order_type="limit", px=99.9, qty=0.5
        ),
        0,
    )
    _run(clock)
    ex.on_trade(trade(99.9, 0.6))  # 0.4 ahead, 0.2 to us
    ex.on_book(make_book(99.8, 99.85))  # the ask fell through our bid: the rest fills
    _run(clock)
    names = [c[0] for c in ex.engine.calls]
    assert names == ["on_ack", "on_fill", "on_fill", "on_done"]
    fills = [c for c in ex.engine.calls if c[0] == "on_fill"]
    assert [round(f[3], 9) for f in fills] == [0.2, 0.3] and all(f[4] == "maker" for f in fills)


def test_market_order_walks_the_book_and_cancel_uses_its_own_latency():
    clock, ex = _exchange("touch")
    ex.on_book(make_book(100.0, 100.1, size=0.01))
    ex.submit(
        OrderIntent(
            client_oid="m",
            symbol="BTCUSDT",
            intent="new",
            side="buy",
            order_type="market",
            px=math.nan,
            qty=0.025,
        ),
        0,
    )
    _run(clock)
    fills = [(c[2], round(c[3], 9)) for c in ex.engine.calls if c[0] == "on_fill"]
    assert fills == [(100.1, 0.01), (100.2, 0.01), (100.3, 0.005)]
    ex.submit(
        OrderIntent(
            client_oid="l",
            symbol="BTCUSDT",
            intent="new",
            side="sell",
            order_type="limit",
            px=101.0,
            qty=0.01,
        ),
        clock.now_ns(),
    )
    _run(clock)
    t0 = clock.now_ns()
    ex.cancel("l", "BTCUSDT", t0)
    _run(clock)
    ack = ex.engine.calls[-1]
    assert ack[0] == "on_cancel_ack" and ack[-1] == t0 + 30  # reported with the exchange time it happened


def test_a_marketable_limit_rests_its_rest_first_in_line_and_a_market_order_expires_its_rest():
    clock, ex = _exchange("queue_power2")
    ex.on_book(make_book(100.0, 100.1, size=0.01))
    buy = OrderIntent(
        client_oid="l", symbol="BTCUSDT", intent="new", side="buy", order_type="limit", px=100.2, qty=0.05
    )
    ex.submit(buy, 0)
    _run(clock)
    (st,) = ex.resting_orders()
    # above the best bid: nobody ahead
    assert (st["client_oid"], st["filled"], st["ahead"]) == ("l", 0.02, 0.0)
    ex.on_trade(trade(100.2, 1.0))
    _run(clock)
    calls = [(c[0], *c[2:-1]) for c in ex.engine.calls]
    assert calls == [
        ("on_ack",),
        ("on_fill", 100.1, 0.01, "taker"),
        ("on_fill", 100.2, 0.01, "taker"),
        ("on_fill", 100.2, 0.03, "maker"),
        ("on_done", "filled"),
    ]
    assert ex.position == pytest.approx(0.05) and not ex.resting
    sell = OrderIntent(
        client_oid="m", symbol="BTCUSDT", intent="new", side="sell", order_type="market", px=math.nan, qty=1.0
    )
    ex.submit(sell, clock.now_ns())
    _run(clock)
    assert ex.engine.calls[-1][:3] == ("on_done", "m", "ioc_remainder_expired")
    assert ex.position == pytest.approx(0.05 - 0.15)


def _scenario() -> list:
    """Random books, trades, orders and cancels through SimExchange for every model: what it reports."""
    rng = random.Random(17)
    out: list = []
    for name in sorted(FILL_MODELS):
        clock, ex = _exchange(name)
        for step in range(300):
            mid = round(100.0 + 0.1 * rng.randint(-3, 3), 10)
            r = rng.random()
            if r < 0.35:
                b = make_book(mid, round(mid + 0.1, 10), levels=rng.choice([15, 4]))
                sizes = tuple(round(rng.uniform(0.0, 2.0), 3) for _ in range(15))
                ex.on_book(b.__class__(**{**{f: getattr(b, f) for f in b.__slots__}, "bid_sz": sizes}))
            elif r < 0.75:
                side = rng.choice(["buy", "sell"])
                ex.on_trade(
                    trade(round(mid + 0.1 * rng.randint(-2, 2), 10), rng.choice([0.1, 0.7, 2.0]), side)
                )
            elif r < 0.95:
                market = rng.random() < 0.2
                o = OrderIntent(
                    client_oid=f"o{step}",
                    symbol="BTCUSDT",
                    intent="new",
                    side=rng.choice(["buy", "sell"]),
                    order_type="market" if market else "limit",
                    px=math.nan if market else round(mid + 0.1 * rng.randint(-3, 3), 10),
                    qty=rng.choice([0.1, 0.3, 1.5, 40.0]),
                )
                ex.submit(o, clock.now_ns())
            else:
                ex.cancel(f"o{rng.randint(0, step)}", "BTCUSDT", clock.now_ns())
            clock.run_before(clock.now_ns() + 7, 100)
        clock.run_all()
        out += [[name, *(repr(float(a)) if isinstance(a, float) else a for a in c)] for c in ex.engine.calls]
    return out


def test_the_models_read_as_plain_python_give_the_compiled_fills():
    compiled = _scenario()
    assert as_plain_python("venue.fills.on_depth", "tests.venue.test_fills._scenario") == compiled
    kinds = {(c[1], c[-2]) for c in compiled if c[1] in ("on_fill", "on_done")}
    assert {("on_fill", "maker"), ("on_fill", "taker"), ("on_done", "ioc_remainder_expired")} <= kinds


def test_the_exchange_refuses_a_reduce_only_order_that_would_not_reduce():
    clock, ex = _exchange("touch")
    ex.on_book(make_book(100.0, 100.1, size=1.0))

    def market(oid, side, qty, reduce_only):
        o = OrderIntent(
            client_oid=oid,
            symbol="BTCUSDT",
            intent="new",
            side=side,
            order_type="market",
            px=math.nan,
            qty=qty,
            reduce_only=reduce_only,
        )
        ex.submit(o, clock.now_ns())
        _run(clock)
        return [c[0] for c in ex.engine.calls if c[1] == oid]

    assert market("r0", "sell", 0.01, True) == ["on_reject"]  # no position: nothing to reduce
    assert ex.engine.calls[-1][2] == "reduce_only_rejected"
    assert market("b", "buy", 0.03, False) == ["on_ack", "on_fill", "on_done"]
    assert ex.position == pytest.approx(0.03)
    assert market("r1", "buy", 0.01, True) == ["on_reject"]  # would increase the long
    assert market("r2", "sell", 0.05, True) == ["on_reject"]  # would flip it short
    assert market("r3", "sell", 0.02, True) == ["on_ack", "on_fill", "on_done"]
    assert ex.position == pytest.approx(0.01)
