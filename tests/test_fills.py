"""Queue-aware fills on L2 snapshots, checked step by step on hand-built books and trades."""

import math

import pytest

from engine.clock import ReplayClock
from engine.events import Trade
from engine.risk import OrderIntent
from tests.helpers import make_book
from venue.exchange import SimExchange
from venue.fills import (
    FILL_MODELS,
    QueueFillModel,
    QueueState,
    RiskAverseQueueModel,
    ThroughFillModel,
    TouchFillModel,
    level_qty,
    log_prob,
    power_prob,
)
from venue.latency import ConstantLatency


def trade(px, sz, side="sell", ts=1):
    return Trade(ts_event=ts, ts_recv=ts, seq=0, symbol="BTCUSDT", trade_id="t", px=px, sz=sz, side=side)


def book_with(bid_sizes, bid=100.0, ask=100.1, levels=15):
    b = make_book(bid, ask, levels=levels)
    sizes = tuple(bid_sizes) + b.bid_sz[len(bid_sizes) :]
    return b.__class__(**{**{f: getattr(b, f) for f in b.__slots__}, "bid_sz": sizes})


def test_level_qty_tells_left_window_from_emptied():
    b = make_book(100.0, 100.1, size=2.0)  # bids 100.0 .. 98.6
    assert level_qty(b, "buy", 99.5) == 2.0
    assert level_qty(b, "buy", 100.05) == 0.0  # inside the spread: nothing ahead
    assert level_qty(b, "buy", 98.0) is None  # beyond the 15th level: left the window, unknown
    short = make_book(100.0, 100.1, size=2.0, levels=3)
    assert level_qty(short, "buy", 98.0) == 0.0  # the whole side is visible: really empty


def test_order_joins_behind_displayed_size_and_trades_eat_the_queue_first():
    m = QueueFillModel(power_prob(2.0), "q")
    st = QueueState("o", "buy", 99.9, 0.5)
    m.on_new(st, book_with([1.0, 3.0]))  # 3.0 displayed at 99.9
    assert st.ahead == 3.0
    assert m.on_trade(st, trade(99.9, 2.0)) == 0.0 and st.ahead == pytest.approx(1.0)
    assert m.on_trade(st, trade(99.9, 0.8, side="buy")) == 0.0  # same-side aggressor: not against us
    filled = m.on_trade(st, trade(99.9, 1.3))  # 1.0 ahead, then 0.3 for us
    assert filled == pytest.approx(0.3) and st.ahead == 0.0


def test_trade_through_our_price_fills_at_once():
    m = QueueFillModel(power_prob(2.0), "q")
    st = QueueState("o", "buy", 99.9, 0.5)
    m.on_new(st, book_with([1.0, 3.0]))
    assert m.on_trade(st, trade(99.8, 0.2)) == pytest.approx(0.2)


def test_unexplained_decrease_is_split_by_the_probability_model():
    m = QueueFillModel(power_prob(2.0), "q")
    st = QueueState("o", "buy", 99.9, 0.5)
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
    conservative = RiskAverseQueueModel()
    st2 = QueueState("o", "buy", 99.9, 0.5)
    conservative.on_new(st2, book_with([1.0, 4.0]))
    st2.ahead = 1.0
    conservative.on_depth(st2, book_with([1.0, 2.0]))
    assert st2.ahead == 1.0  # cancels are never ahead of us


def test_growth_joins_behind_and_leaving_the_window_keeps_the_estimate():
    m = QueueFillModel(log_prob, "q")
    st = QueueState("o", "buy", 99.9, 0.5)
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
    assert power_prob(2.0)(0.0, 5.0) == 1.0  # nobody ahead: every cancel is behind
    assert power_prob(2.0)(5.0, 0.0) == 0.0
    assert 0 < log_prob(3.0, 1.0) < 0.5 < log_prob(1.0, 3.0) < 1


def test_touch_and_through_baselines():
    st = QueueState("o", "buy", 99.9, 0.5)
    assert TouchFillModel().on_trade(st, trade(99.9, 0.2)) == 0.2
    assert ThroughFillModel().on_trade(st, trade(99.9, 0.2)) == 0.0
    assert ThroughFillModel().on_trade(st, trade(99.8, 0.9)) == 0.5
    assert set(FILL_MODELS) >= {"touch", "through", "queue_power2", "queue_log", "risk_averse"}


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
