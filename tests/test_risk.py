import math
from dataclasses import replace

import pytest

from engine.book import walk_book
from engine.risk import (
    R_LOSS,
    R_LOSS_UNDECIDED,
    R_OK,
    REASONS,
    OrderIntent,
    RiskLimits,
    RiskState,
    check,
    limits_array,
    loss_stop,
)
from tests.helpers import as_plain_python, make_book

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


RULE_CASES = [
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
]


@pytest.mark.parametrize("state, intent, book, now, reason", RULE_CASES)
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
    with pytest.raises(ValueError):
        RiskLimits(price_band_bps=math.nan)  # a NaN limit would switch its rule off


# ---- fail closed: the holes found by issue 16, each reproduced with the default limits


def _with_top(book, *, bid=None, ask=None, bid_sz=None, ask_sz=None):
    def top(t, v):
        return t if v is None else (v, *t[1:])

    return replace(
        book,
        bid_px=top(book.bid_px, bid),
        ask_px=top(book.ask_px, ask),
        bid_sz=top(book.bid_sz, bid_sz),
        ask_sz=top(book.ask_sz, ask_sz),
    )


DEFAULT = RiskLimits()
WIDE = make_book(50_000.0, 50_000.1, ts=NOW, size=1.0)


@pytest.mark.parametrize(
    "top",
    [
        {"bid": math.nan},
        {"ask": math.nan},
        {"bid": math.inf},
        {"ask": math.inf},
        {"bid": -1.0},
        {"bid": 0.0},
        {"bid": 50_001.0},  # crossed
        {"bid": 50_000.1},  # locked
        {"bid_sz": math.nan},
        {"ask_sz": 0.0},
    ],
)
def test_no_new_order_without_a_valid_two_sided_book(top):
    book = _with_top(WIDE, **top)
    # A limit buy at 1e9 passed the price band when the mid was NaN; a market buy passed slippage.
    assert check(DEFAULT, RiskState(), limit(px=1e9, qty=0.001), book, NOW) == (False, "bad_book")
    assert check(DEFAULT, RiskState(), market(qty=0.001), book, NOW) == (False, "bad_book")
    assert check(DEFAULT, RiskState(), limit(px=50_000.0, qty=0.001), WIDE, NOW) == (True, "ok")


def test_a_reducing_order_counts_what_rests_on_its_side():
    st = RiskState(position=0.01, open_sell_qty=0.1)
    # worst case -0.11 against a 0.05 limit: it does not reduce anything
    assert check(DEFAULT, st, limit(side="sell", px=50_000.1, qty=0.02), WIDE, NOW) == (False, "max_position")
    # with nothing resting the same sell only shrinks the position
    st = RiskState(position=0.01)
    assert check(DEFAULT, st, limit(side="sell", px=50_000.1, qty=0.005), WIDE, NOW) == (True, "ok")


def test_a_reducing_order_passes_the_limits_it_cannot_worsen():
    # over the position limit and past the loss stop, a sell that shrinks the worst case still goes
    st = RiskState(position=0.08, open_sell_qty=0.01, pnl_usd=-1e6)
    assert check(DEFAULT, st, limit(side="sell", px=50_000.1, qty=0.02), WIDE, NOW) == (True, "ok")
    assert check(DEFAULT, st, limit(side="buy", px=50_000.0, qty=0.001), WIDE, NOW)[0] is False


@pytest.mark.parametrize(
    "position, side, qty, ok",
    [
        (0.05, "buy", 0.02, False),  # the case: a reduce-only buy on a long
        (0.0, "sell", 0.01, False),  # nothing to reduce
        (0.05, "sell", 0.02, True),
        (0.01, "sell", 0.02, False),  # would flip the position
        (-0.02, "buy", 0.02, True),
    ],
)
def test_reduce_only_is_checked_not_trusted(position, side, qty, ok):
    intent = market(side=side, qty=qty, reduce_only=True)
    got = check(DEFAULT, RiskState(position=position), intent, WIDE, NOW)
    assert got == ((True, "ok") if ok else (False, "reduce_only"))


def test_walk_book_stops_at_the_first_level_that_is_not_real():
    book = make_book(100.0, 100.1, size=0.01)
    nan_size = replace(book, ask_sz=(0.01, math.nan, *book.ask_sz[2:]))
    assert walk_book(nan_size, "buy", 1.0) == [(100.1, 0.01)]  # a NaN size was unlimited liquidity
    negative = replace(book, ask_sz=(0.01, -5.0, *book.ask_sz[2:]))
    assert walk_book(negative, "buy", 1.0) == [(100.1, 0.01)]
    backwards = replace(book, ask_px=(100.1, 100.0, *book.ask_px[2:]))
    assert walk_book(backwards, "buy", 1.0) == [(100.1, 0.01)]
    # so a market order that needs those levels is refused for slippage, not filled on fiction
    assert check(LIMITS, RiskState(), market(qty=0.015), nan_size, NOW) == (False, "max_slippage")


def test_the_kill_switch_lets_only_reduce_only_flattening_through():
    st = RiskState(position=0.03, kill_switch=True)
    flatten = market(side="sell", qty=0.02, reduce_only=True, source="flatten")
    assert check(DEFAULT, st, flatten, WIDE, NOW) == (True, "ok")
    assert check(DEFAULT, st, replace(flatten, source="kev"), WIDE, NOW) == (False, "kill_switch")
    assert check(DEFAULT, st, replace(flatten, reduce_only=False), WIDE, NOW) == (False, "kill_switch")
    # and it still may not open or flip a position
    assert check(DEFAULT, st, replace(flatten, side="buy"), WIDE, NOW) == (False, "reduce_only")


def test_an_estimated_pnl_too_close_to_the_stop_is_undecided():
    lim = limits_array(LIMITS)  # stop at -10
    assert loss_stop(lim, -9.9, 0.01) == R_OK
    assert loss_stop(lim, -10.005, 0.01) == loss_stop(lim, -9.995, 0.01) == R_LOSS_UNDECIDED
    assert loss_stop(lim, -10.02, 0.01) == R_LOSS
    # an exact PnL is always decided: at the stop it stops, and NaN stops too
    assert loss_stop(lim, -10.0, 0.0) == loss_stop(lim, math.nan, 0.0) == R_LOSS


def _verdicts() -> list:
    """check() over the rule table and seeded fuzz cases (hostile books, states and intents), and the
    loss stop's answers around its tolerance."""
    from tests.risk_fuzz import LIMITS as FUZZ_LIMITS
    from tests.risk_fuzz import NOW as FUZZ_NOW
    from tests.risk_fuzz import gen_cases

    out: list = [check(LIMITS, st, it, book, now)[1] for st, it, book, now, _ in RULE_CASES]
    for st, its, book in gen_cases(seed=5, n=150):
        out += [check(FUZZ_LIMITS, st, it, book, FUZZ_NOW)[1] for it in its]
    lim = limits_array(LIMITS)
    out += [
        loss_stop(lim, p, tol) for p in (-9.0, -10.0, -10.0 + 1e-9, -11.0, math.nan) for tol in (0.0, 1e-6)
    ]
    return out


def test_the_rules_read_as_plain_python_give_the_compiled_verdicts():
    pure = as_plain_python("engine.risk.verdict", "tests.test_risk._verdicts")
    compiled = _verdicts()
    assert pure == compiled
    assert set(REASONS) <= set(compiled) and R_LOSS_UNDECIDED in compiled  # every rule was reached
