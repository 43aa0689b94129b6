"""The core's own order logic (engine/kernel.py), driven one event at a time through engine.core.Engine."""

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
