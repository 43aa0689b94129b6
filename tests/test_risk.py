import math
from dataclasses import replace

import pytest

from engine.book import walk_book
from engine.risk import OrderIntent, RiskLimits, RiskState, check
from tests.helpers import make_book

NOW = 1_000_000_000
LIMITS = RiskLimits(
    max_position=0.05,
    max_net_delta_usd=4.0,
    max_order_qty=0.02,
    max_slippage_bps=50.0,
    price_band_bps=50.0,
    max_orders_per_s=3,
    stale_book_ns=2_000_000_000,
    daily_loss_stop_usd=10.0,
)
BOOK = make_book(100.0, 100.1, ts=NOW, size=0.01)


def limit(side="buy", px=100.0, qty=0.01, **kw):
    return OrderIntent(
        client_oid="o", symbol="BTCUSDT", intent="new", side=side, order_type="limit", px=px, qty=qty, **kw
    )


def market(side="buy", qty=0.01, **kw):
    return OrderIntent(
        client_oid="o",
        symbol="BTCUSDT",
        intent="new",
        side=side,
        order_type="market",
        px=math.nan,
        qty=qty,
        **kw,
    )


def test_plain_order_is_accepted():
    assert check(LIMITS, RiskState(), limit(), BOOK, NOW) == (True, "ok")


@pytest.mark.parametrize(
    "state, intent, book, now, reason",
    [
        (RiskState(kill_switch=True), limit(), BOOK, NOW, "kill_switch"),
        (RiskState(), limit(), None, NOW, "no_book"),
        (RiskState(), limit(), BOOK, NOW + 2_000_000_001, "stale_book"),
        (RiskState(), limit(qty=0.03), BOOK, NOW, "max_order_qty"),
        (RiskState(position=0.045), limit(qty=0.01), BOOK, NOW, "max_position"),
        (RiskState(open_buy_qty=0.045), limit(qty=0.01), BOOK, NOW, "max_position"),
        (RiskState(position=0.035), limit(qty=0.01), BOOK, NOW, "max_net_delta"),
        (RiskState(), limit(px=101.0), BOOK, NOW, "price_band"),
        (RiskState(), market(qty=0.02, max_slippage_bps=8.0), BOOK, NOW, "max_slippage"),
        (RiskState(), market(qty=0.01, max_slippage_bps=1.0), BOOK, NOW, "max_slippage"),
        (RiskState(recent_order_ns=(NOW - 10, NOW - 20, NOW - 30)), limit(), BOOK, NOW, "order_rate"),
        (RiskState(pnl_usd=-10.0), limit(), BOOK, NOW, "loss_stop"),
        (RiskState(), limit(qty=-1), BOOK, NOW, "bad_order"),
        (RiskState(), limit(px=math.nan), BOOK, NOW, "bad_order"),
    ],
)
def test_each_rule_rejects_with_its_reason(state, intent, book, now, reason):
    assert check(LIMITS, state, intent, book, now) == (False, reason)


def test_old_orders_leave_the_rate_window():
    st = RiskState(recent_order_ns=(NOW - 2_000_000_000,) * 5)
    assert check(LIMITS, st, limit(), BOOK, NOW) == (True, "ok")


def test_reducing_orders_pass_position_and_loss_limits():
    st = RiskState(position=0.05, pnl_usd=-50.0)
    assert check(LIMITS, st, limit(side="sell", px=100.1), BOOK, NOW) == (True, "ok")
    assert check(LIMITS, st, limit(side="buy"), BOOK, NOW)[1] == "max_position"


def test_cancels_always_pass_even_with_kill_switch():
    cancel = replace(limit(), intent="cancel")
    assert check(LIMITS, RiskState(kill_switch=True), cancel, None, NOW) == (True, "ok")


def test_market_order_within_displayed_depth_and_slippage_passes():
    assert check(LIMITS, RiskState(), market(qty=0.01), BOOK, NOW) == (True, "ok")


def test_check_is_pure():
    st = RiskState(recent_order_ns=(NOW,))
    a = check(LIMITS, st, limit(), BOOK, NOW)
    b = check(LIMITS, st, limit(), BOOK, NOW)
    assert a == b and st.recent_order_ns == (NOW,)


def test_walk_book_consumes_levels_in_order():
    book = make_book(100.0, 100.1, size=0.01)
    assert walk_book(book, "buy", 0.025) == [(100.1, 0.01), (100.2, 0.01), (100.3, 0.005)]
    assert walk_book(book, "sell", 0.01) == [(100.0, 0.01)]
    short = make_book(100.0, 100.1, size=0.01, levels=2)
    assert sum(q for _, q in walk_book(short, "buy", 1.0)) == pytest.approx(0.02)


def test_limits_are_validated():
    with pytest.raises(ValueError):
        RiskLimits(max_position=0)
