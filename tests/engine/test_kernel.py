"""The core's own order logic (engine/kernel/), driven one event at a time through engine.core.Engine."""

from __future__ import annotations

import numpy as np

from engine import kernel as K
from engine.clock import ReplayClock
from engine.contract import ContractConfig
from engine.core import Engine, EngineConfig
from engine.eventlog import EventLog
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig
from tests.helpers import make_book


class _Orders:
    """An execution client that only keeps what the engine sends."""

    def __init__(self) -> None:
        self.sent: list = []

    def submit(self, intent, now_ns) -> None:
        self.sent.append(intent)

    def cancel(self, client_oid, symbol, now_ns) -> None:
        pass


def test_a_flatten_command_sells_what_the_quotes_resting_on_its_side_leave_uncovered(tmp_path):
    """Reduce-only counts the resting orders on the order's own side (a flatten beside a resting sell
    could otherwise end short). Kev's EMERGENCY_FLATTEN of a long 0.01 while a 0.002 sell quote rests:
    the rebalance sends a reduce-only sell of the 0.008 the quote leaves uncovered, which the gateway
    accepts, instead of a sell of 0.01 that it must refuse."""
    (tmp_path / "events").mkdir()
    clock, log, orders = ReplayClock(), EventLog(tmp_path / "events"), _Orders()
    hold = (0, np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32))
    cfg = EngineConfig(
        symbol="BTCUSDT",
        contract=ContractConfig(),
        risk=RiskLimits(max_position=0.05, max_order_qty=0.02, max_net_delta_usd=1e6),
        quotes=QuoteConfig(quote_qty=0.002),
    )
    engine = Engine(cfg, clock=clock, log=log, labeler=lambda b: hold, kev=None, execution=orders, advisor_name="none")
    t = 1_000_000_000
    book = make_book(60_000.0, 60_000.1, ts=t, size=1.0)
    clock.advance_to(t)
    engine.on_book(book)
    clock.run_all()
    assert [(o.side, o.order_type) for o in orders.sent] == [("buy", "limit"), ("sell", "limit")]
    # Kev wants long 0.01: a market buy of 0.01, filled
    t += 2_000_000_000
    clock.advance_to(t)
    engine.command(1, 0, t, K.A_LEAN_BUY, 0.01, 1.0, 50.0)
    buy = orders.sent[-1]
    assert (buy.side, buy.order_type, buy.qty, buy.source) == ("buy", "market", 0.01, "kev")
    engine.on_ack(buy.client_oid, t)
    engine.on_fill(buy.client_oid, 60_000.1, 0.01, "taker", t)
    engine.on_done(buy.client_oid, "filled", t)
    # then EMERGENCY_FLATTEN, the 0.002 sell quote still resting
    t += 2_000_000_000
    clock.advance_to(t)
    engine.on_book(make_book(60_000.0, 60_000.1, ts=t, size=1.0))  # a fresh book, HOLD: quotes stay
    clock.run_all()
    assert [o.side for o in orders.sent[-2:]] != ["sell", "sell"]
    n = len(orders.sent)
    engine.command(2, 0, t, K.A_FLATTEN, 0.0, 1.0, 50.0)
    sent = orders.sent[n:]
    assert [(o.side, o.order_type, o.qty, o.reduce_only, o.source) for o in sent] == [
        ("sell", "market", 0.008, True, "flatten")
    ]


def test_the_portfolio_rules_see_the_others_after_their_legs_of_a_unit():
    """While a hub command's legs go out (engine/legs.py), each other instrument's leg (PF_LEG) counts
    in the net delta and gross exposure the portfolio rules read; without one, what it holds."""
    PI = np.zeros(K.PI_SIZE, dtype=np.int64)
    PF = np.zeros((3, K.PF_COLS))
    S = np.zeros(K.S_SIZE, dtype=np.int64)
    SF = np.zeros(K.SF_SIZE)
    PF[1, [K.PF_DELTA, K.PF_GROSS, K.PF_PNL]] = (500.0, 500.0, -3.0)
    PF[2, [K.PF_DELTA, K.PF_GROSS, K.PF_PNL]] = (-200.0, 200.0, 1.0)
    K.pf_enter(PI, PF, 0, S, SF)
    assert (SF[K.SF_OTHERS_DELTA], SF[K.SF_OTHERS_GROSS], SF[K.SF_OTHERS_PNL]) == (300.0, 700.0, -2.0)
    PF[1, K.PF_LEG] = -2000.0  # instrument 1 sells 2000 USD in the same unit
    K.pf_enter(PI, PF, 0, S, SF)
    assert (SF[K.SF_OTHERS_DELTA], SF[K.SF_OTHERS_GROSS], SF[K.SF_OTHERS_PNL]) == (-1700.0, 1700.0, -2.0)
    K.pf_enter(PI, PF, 1, S, SF)  # its own leg is its order, not the others'
    assert (SF[K.SF_OTHERS_DELTA], SF[K.SF_OTHERS_GROSS]) == (-200.0, 200.0)


def test_an_unwinding_order_passes_every_portfolio_rule_even_with_quotes_resting_on_its_side():
    from engine.risk import OrderIntent, RiskState, check

    rules = "bad_order,kill_switch,no_book,bad_book,reduce_only,portfolio_net_delta,portfolio_gross,portfolio_loss_stop"
    lim = RiskLimits(
        rules=rules, portfolio_max_net_delta_usd=1.0, portfolio_max_gross_usd=1.0, portfolio_loss_stop_usd=1.0
    )
    book = make_book(100.0, 100.1)
    # long 0.02, a resting sell quote of 0.002, the rest of the portfolio far over every limit and losing
    st = RiskState(
        position_units=2 * 10**10, open_sell_qty=0.002, cash_units=-10**15,
        others_delta_usd=5e4, others_gross_usd=5e4, others_pnl_usd=-500.0,
    )  # fmt: skip

    def order(side: str, qty: float) -> tuple[bool, str]:
        intent = OrderIntent(client_oid="x", symbol="BTCUSDT", intent="new", side=side, order_type="market",
                             px=float("nan"), qty=qty, source="kev", advice_age_ns=0)  # fmt: skip
        return check(lim, st, intent, book, book.ts_recv)

    assert order("sell", 0.02) == (True, "ok")  # closes the position: with the quote it would cross zero
    assert order("sell", 0.01) == (True, "ok")
    assert order("sell", 0.021)[0] is False  # through zero: the opening part is judged
    assert order("buy", 0.001) == (False, "portfolio_net_delta")


def test_a_warm_engine_logs_nothing_before_its_first_event(tmp_path):
    """Building an engine warm runs every compiled entry once on a scratch copy of its state (its first
    frame must not wait for the compiler): none of those steps' rows may reach the run's buffer or log."""
    (tmp_path / "events").mkdir()
    clock, log, orders = ReplayClock(), EventLog(tmp_path / "events"), _Orders()
    hold = (0, np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32))
    cfg = EngineConfig(symbol="BTCUSDT", contract=ContractConfig(), quotes=QuoteConfig(quote_qty=0.002))
    engine = Engine(
        cfg, clock=clock, log=log, labeler=lambda b: hold, kev=None, execution=orders, advisor_name="none"
    )
    assert int(engine.core.NOUT.sum()) == 0 and not orders.sent
    log.write()
    assert all(n == 0 for n in log.counts().values()), log.counts()
