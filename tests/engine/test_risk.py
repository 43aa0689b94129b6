import math
import random
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest

from dualhub.cli import main
from engine.book import walk_book
from engine.errors import DualhubError
from engine.events import BookSnapshot
from engine.portfolio import units
from engine.risk import (
    DEFAULT_RULES,
    MANDATORY_RULES,
    R_OK,
    REASONS,
    RULES,
    OrderIntent,
    RiskLimits,
    RiskState,
    check,
    in_price_band,
    limits_array,
    loss_ok,
    rule_codes,
    units_words,
)
from tests.helpers import as_plain_python, make_book
from tests.risk_fuzz import read_prices

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
    (RiskState(position_units=units(0.045)), limit(qty=0.01), BOOK, NOW, "max_position"),
    (RiskState(open_buy_qty=0.045), limit(qty=0.01), BOOK, NOW, "max_position"),
    (RiskState(position_units=units(0.035)), limit(qty=0.01), BOOK, NOW, "max_net_delta"),
    (RiskState(), limit(px=101.0), BOOK, NOW, "price_band"),
    (RiskState(), market(qty=0.02, max_slippage_bps=8.0), BOOK, NOW, "max_slippage"),
    (RiskState(), market(qty=0.01, max_slippage_bps=1.0), BOOK, NOW, "max_slippage"),
    (RiskState(recent_order_ns=(NOW - 10, NOW - 20, NOW - 30)), limit(), BOOK, NOW, "order_rate"),
    (RiskState(cash_units=units(-10.0)), limit(), BOOK, NOW, "loss_stop"),
    (RiskState(), limit(qty=-1), BOOK, NOW, "bad_order"),
    (RiskState(), limit(px=math.nan), BOOK, NOW, "bad_order"),
    # sizes of whole lots of the 0.001 step only: the exchange refuses any other
    (RiskState(), limit(qty=0.0015), BOOK, NOW, "bad_order"),
    (RiskState(), limit(qty=0.0005), BOOK, NOW, "bad_order"),
    (RiskState(), limit(qty=0.1 + 0.2), BOOK, NOW, "bad_order"),  # 0.30000000000000004
]


def test_a_size_of_whole_lots_of_the_contracts_step_passes():
    assert check(LIMITS, RiskState(), limit(qty=0.003), BOOK, NOW) == (True, "ok")
    assert check(LIMITS, RiskState(), limit(qty=0.0015), BOOK, NOW, size_step=0.0005) == (True, "ok")
    assert check(LIMITS, RiskState(), limit(qty=0.003), BOOK, NOW, size_step=0.002) == (False, "bad_order")


def test_a_limit_price_must_be_whole_ticks_of_the_contracts_tick():
    """The core holds an order's price as whole ticks: a price off the grid (or the float noise of a
    sum, which no exchange string parses to) is refused before it gets there, as the exchange would."""
    assert check(LIMITS, RiskState(), limit(px=100.1), BOOK, NOW) == (True, "ok")
    assert check(LIMITS, RiskState(), limit(px=100.05), BOOK, NOW) == (False, "bad_order")
    assert check(LIMITS, RiskState(), limit(px=100.05), BOOK, NOW, tick=0.01) == (True, "ok")
    assert check(LIMITS, RiskState(), limit(px=100.1), BOOK, NOW, tick=0.5) == (False, "bad_order")
    assert check(LIMITS, RiskState(), limit(px=99.9 + 0.2), BOOK, NOW) == (
        False,
        "bad_order",
    )  # 100.10000000000001
    assert check(LIMITS, RiskState(), market(), BOOK, NOW) == (True, "ok")  # a market order has no price


def test_the_band_and_the_slippage_are_measured_in_ticks_exactly_at_their_edge():
    """Around a mid of 100.0 (99.9 / 100.1), a limit at 100.2 is exactly 20 bps away and a market buy of
    two levels (100.1 and 100.2, ten lots each) averages exactly 15 bps above it. In ticks both are
    integers and the edge passes (the rules hold ``value <= limit``); in prices the subtraction's float
    noise (100.2 - 100.0 = 0.20000000000000284) had refused both."""
    book = make_book(99.9, 100.1, ts=NOW, size=0.01)
    assert check(replace(LIMITS, price_band_bps=20.0), RiskState(), limit(px=100.2), book, NOW) == (
        True,
        "ok",
    )
    assert check(replace(LIMITS, price_band_bps=19.99), RiskState(), limit(px=100.2), book, NOW) == (
        False,
        "price_band",
    )
    assert check(replace(LIMITS, price_band_bps=20.0), RiskState(), limit("sell", px=99.8), book, NOW) == (
        True,
        "ok",
    )
    assert check(LIMITS, RiskState(), market(qty=0.02, max_slippage_bps=15.0), book, NOW) == (True, "ok")
    assert check(LIMITS, RiskState(), market(qty=0.02, max_slippage_bps=14.99), book, NOW) == (
        False,
        "max_slippage",
    )
    # bad_book runs before them, but alone they fail closed too on a touch with no true mid: past what
    # doubles hold (an infinite sum would pass any band), or not a number
    lim = limits_array(replace(LIMITS, price_band_bps=math.inf))
    for bid, ask in ((99.9, 1.7e308), (math.nan, 100.1), (0.0, 100.1)):
        assert not in_price_band(lim, 100.0, bid, ask)
    assert in_price_band(lim, 100.0, 99.9, 100.1)


def test_sizes_are_taken_in_lots_exactly_at_the_position_limit():
    """A position of 100780.964 and a buy of 7.994 (lots of 0.001) reach a limit of 100788.958 exactly:
    in lots the sum is that integer and the edge passes; in floats it is 100788.95800000001, past the
    limit by more than any tolerance below the double's own spacing there (1.5e-11)."""
    big = replace(LIMITS, max_position=100788.958, max_order_qty=10.0, max_net_delta_usd=1e12)
    held = RiskState(position_units=100780964 * 10**9)
    assert check(big, held, limit(qty=7.994), BOOK, NOW) == (True, "ok")
    assert check(big, held, limit(qty=7.995), BOOK, NOW) == (False, "max_position")
    # resting buys count at their lots too, as an unknown (NaN) open size counts as the largest
    assert check(big, replace(held, open_buy_qty=0.001), limit(qty=7.994), BOOK, NOW) == (
        False,
        "max_position",
    )
    assert check(big, RiskState(open_buy_qty=math.nan), limit(qty=0.001), BOOK, NOW) == (
        False,
        "max_position",
    )
    # the order limit is whole lots: 0.0025 allows two of 0.001
    half = replace(LIMITS, max_order_qty=0.0025)
    assert check(half, RiskState(), limit(qty=0.002), BOOK, NOW) == (True, "ok")
    assert check(half, RiskState(), limit(qty=0.003), BOOK, NOW) == (False, "max_order_qty")


@pytest.mark.parametrize("state, intent, book, now, reason", RULE_CASES)
def test_each_rule_rejects_with_its_reason(state, intent, book, now, reason):
    assert check(LIMITS, state, intent, book, now) == (False, reason)


def test_old_orders_leave_the_rate_window():
    st = RiskState(recent_order_ns=(NOW - 2_000_000_000,) * 5)
    assert check(LIMITS, st, limit(), BOOK, NOW) == (True, "ok")


def test_reducing_orders_pass_position_and_loss_limits():
    st = RiskState(position_units=units(0.05), cash_units=units(-55.0))  # PnL -50 at the mid
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
    assert walk_book(book, "buy", 0.025, 0.001) == [(100.1, 0.01), (100.2, 0.01), (100.3, 0.005)]
    assert walk_book(book, "sell", 0.01, 0.001) == [(100.0, 0.01)]
    short = make_book(100.0, 100.1, size=0.01, levels=2)
    assert sum(q for _, q in walk_book(short, "buy", 1.0, 0.001)) == pytest.approx(0.02)


def test_the_walk_takes_whole_lots_and_passes_over_a_level_of_less_than_one():
    book = make_book(100.0, 100.1, size=0.01)
    odd = replace(book, ask_sz=(0.0149, 0.0004, 0.003, *book.ask_sz[3:]))
    # 14 lots of 0.001 in 0.0149; none in 0.0004; 0.003 / 0.001 is 2.9999999999999996, still 3 lots
    assert walk_book(odd, "buy", 0.02, 0.001) == [(100.1, 0.014), (100.3, 0.003), (100.4, 0.003)]
    # the same book in lots of 0.01: one lot at the top, the next two levels give nothing
    assert walk_book(odd, "buy", 0.02, 0.01) == [(100.1, 0.01), (100.4, 0.01)]
    # takes of sizes like 0.1 and 0.2 add up to the order: integers of lots, no decimal rounding
    tenths = replace(book, ask_sz=(0.1, 0.2, *book.ask_sz[2:]))
    assert walk_book(tenths, "buy", 0.3, 0.001) == [(100.1, 0.1), (100.2, 0.2)]


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
    st = RiskState(position_units=units(0.01), open_sell_qty=0.1)
    # worst case -0.11 against a 0.05 limit: it does not reduce anything
    assert check(DEFAULT, st, limit(side="sell", px=50_000.1, qty=0.02), WIDE, NOW) == (False, "max_position")
    # with nothing resting the same sell only shrinks the position
    st = RiskState(position_units=units(0.01))
    assert check(DEFAULT, st, limit(side="sell", px=50_000.1, qty=0.005), WIDE, NOW) == (True, "ok")


def test_a_reducing_order_passes_the_limits_it_cannot_worsen():
    # over the position limit and past the loss stop, a sell that shrinks the worst case still goes
    st = RiskState(position_units=units(0.08), open_sell_qty=0.01, cash_units=units(-1e6))
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
    got = check(DEFAULT, RiskState(position_units=units(position)), intent, WIDE, NOW)
    assert got == ((True, "ok") if ok else (False, "reduce_only"))


def test_walk_book_stops_at_the_first_level_that_is_not_real():
    book = make_book(100.0, 100.1, size=0.01)
    nan_size = replace(book, ask_sz=(0.01, math.nan, *book.ask_sz[2:]))
    assert walk_book(nan_size, "buy", 1.0, 0.001) == [(100.1, 0.01)]  # a NaN size was unlimited liquidity
    negative = replace(book, ask_sz=(0.01, -5.0, *book.ask_sz[2:]))
    assert walk_book(negative, "buy", 1.0, 0.001) == [(100.1, 0.01)]
    backwards = replace(book, ask_px=(100.1, 100.0, *book.ask_px[2:]))
    assert walk_book(backwards, "buy", 1.0, 0.001) == [(100.1, 0.01)]
    # so a market order that needs those levels is refused for slippage, not filled on fiction
    assert check(LIMITS, RiskState(), market(qty=0.015), nan_size, NOW) == (False, "max_slippage")


def test_the_kill_switch_lets_only_reduce_only_flattening_through():
    st = RiskState(position_units=units(0.03), kill_switch=True)
    flatten = market(side="sell", qty=0.02, reduce_only=True, source="flatten")
    assert check(DEFAULT, st, flatten, WIDE, NOW) == (True, "ok")
    assert check(DEFAULT, st, replace(flatten, source="kev"), WIDE, NOW) == (False, "kill_switch")
    assert check(DEFAULT, st, replace(flatten, reduce_only=False), WIDE, NOW) == (False, "kill_switch")
    # and it still may not open or flip a position
    assert check(DEFAULT, st, replace(flatten, side="buy"), WIDE, NOW) == (False, "reduce_only")


# ---- the loss stop: one exact decision over the integers of 1e-12 both engines keep


def _loss_ok(stop: float, position_units: int, cash_units: int, mid: float) -> bool:
    lim = limits_array(replace(LIMITS, daily_loss_stop_usd=stop))
    return bool(loss_ok(lim, *units_words(position_units), *units_words(cash_units), mid))


def _exactly_above(stop: float, position_units: int, cash_units: int, mid: float) -> bool:
    """The oracle: ``cash + position * mid > -stop`` in rationals (the stop as the float it is, the mark
    as a price: the decimal it reads as, tests/risk_fuzz.py read_prices)."""
    (m,) = read_prices(mid)
    return Fraction(cash_units) + Fraction(position_units) * m + Fraction(stop) * 10**12 > 0


def test_the_loss_stop_is_decided_exactly_at_its_limit():
    assert _loss_ok(10.0, 0, -(10 * 10**12) + 1, 100.05)  # 1e-12 above the stop: trading goes on
    assert not _loss_ok(10.0, 0, -(10 * 10**12), 100.05)  # at the stop: it stops
    # 0.01 BTC at 100.05, read as the decimal the exchange sent (not the float 100.04999999999999715...):
    # the cash that puts the PnL at -10 exactly is at the stop
    assert not _loss_ok(10.0, units(0.01), units(-11.0005), (100.0 + 100.1) / 2)
    assert _loss_ok(10.0, units(0.01), units(-11.0005) + 1, (100.0 + 100.1) / 2)
    # a NaN or infinite mark, or a word too large for the rule, stops; an infinite stop never does
    assert not _loss_ok(10.0, units(0.01), 0, math.nan)
    assert not _loss_ok(10.0, units(0.01), 0, -math.inf)
    assert not _loss_ok(10.0, 1 << 90, 0, 100.0)
    assert _loss_ok(math.inf, -units(1.0), 0, 1e300)


def test_the_loss_stop_agrees_with_rational_arithmetic_next_to_the_limit():
    """Seeded cases built to land within a few units of 1e-12 of the stop (where floats alone cannot
    tell), over positions and cash beyond int64 too (the Python engine's Decimals have no bound; the
    rule reads up to 2**85 units, 3.9e13 USDT or base units, and stops beyond)."""
    rng = random.Random(11)
    seen = set()
    for _ in range(3_000):
        stop = rng.choice([0.05, 10.0, 100.0, 123.456789, 1e9, 1e-9])
        mid = rng.choice([100.05, 50_000.15, 0.123456789, 3e9 + 0.5, rng.uniform(1, 1e5)])
        big = int(2**84 / max(mid, 1.0))  # cash of the same size stays within the rule's 2**85 units
        pos = rng.choice([0, 1, -1, rng.randrange(-(10**15), 10**15), rng.randrange(-big, big)])
        # the cash that puts the PnL at the stop, give or take a few units
        at = -(Fraction(pos) * Fraction(mid) + Fraction(stop) * 10**12)
        cash = math.floor(at) + rng.randrange(-3, 4)
        want = _exactly_above(stop, pos, cash, mid)
        assert _loss_ok(stop, pos, cash, mid) == want, (stop, pos, cash, mid)
        seen.add(want)
    assert seen == {True, False}


def test_the_engine_reads_its_portfolio_in_units_exactly():
    from decimal import Decimal

    assert units(Decimal("-11.000500000000")) == -11_000_500_000_000
    assert units(0.045) == 45_000_000_000 and units(Decimal("1e-12")) == 1
    st = RiskState(position_units=units(0.1) * 10**9)  # 1e8 BTC: units beyond int64
    assert st.position == 1e8
    assert units_words(st.position_units)[0] * 2**32 + units_words(st.position_units)[1] == st.position_units


# ---- the rules: an ordered, configurable list


def test_the_default_list_is_every_rule_in_the_gateways_order():
    assert sorted(DEFAULT_RULES) == sorted(RULES) and RiskLimits().rules == DEFAULT_RULES
    assert [REASONS[c] for c in rule_codes(RiskLimits())] == list(DEFAULT_RULES)
    codes = rule_codes(RiskLimits(rules=MANDATORY_RULES))
    assert [REASONS[c] for c in codes[: len(MANDATORY_RULES)]] == list(MANDATORY_RULES)
    assert (codes[len(MANDATORY_RULES) :] == R_OK).all() and codes.dtype == np.int64


def test_the_list_chooses_which_rules_run_and_in_what_order():
    far = limit(px=101.0, qty=0.03)  # outside the price band and over max_order_qty
    assert check(LIMITS, RiskState(), far, BOOK, NOW) == (False, "max_order_qty")
    band_first = [r for r in DEFAULT_RULES if r != "price_band"]
    band_first.insert(band_first.index("max_order_qty"), "price_band")
    assert check(replace(LIMITS, rules=tuple(band_first)), RiskState(), far, BOOK, NOW) == (
        False,
        "price_band",
    )
    # without the band and the size limit the same order goes
    fewer = tuple(r for r in DEFAULT_RULES if r not in ("price_band", "max_order_qty", "max_net_delta"))
    assert check(replace(LIMITS, rules=fewer), RiskState(), far, BOOK, NOW) == (True, "ok")
    # the loss stop left out: a state past it trades; the mandatory rules still bind
    no_stop = RiskLimits(rules=",".join(r for r in DEFAULT_RULES if r != "loss_stop"))
    assert check(no_stop, RiskState(cash_units=units(-1e6)), limit(px=50_000.0, qty=0.001), WIDE, NOW)[0]
    assert check(no_stop, RiskState(kill_switch=True), limit(), BOOK, NOW) == (False, "kill_switch")


@pytest.mark.parametrize(
    "rules, message",
    [
        ("bad_order,kill_switch,no_book,bad_book,reduce_only,loss_stops", "unknown risk rule 'loss_stops'"),
        ("bad_order,kill_switch,no_book,bad_book", "must include reduce_only"),
        (",".join(r for r in DEFAULT_RULES if r != "kill_switch"), "must include kill_switch"),
        ("kill_switch,bad_order,no_book,bad_book,reduce_only", "'bad_order' must come first"),
        (
            "bad_order,kill_switch,no_book,price_band,bad_book,reduce_only",
            "before the rules that read the book",
        ),
        ("bad_order,kill_switch,bad_book,no_book,reduce_only", "'no_book' then 'bad_book'"),
        ("bad_order,kill_switch,no_book,bad_book,reduce_only,order_rate,order_rate", "listed twice"),
        ("", "unknown risk rule ''"),
    ],
)
def test_a_rule_list_that_is_not_safe_is_refused_in_one_line(rules, message):
    with pytest.raises(DualhubError, match=message) as e:
        RiskLimits(rules=rules)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cmd", ["replay", "live"])
def test_the_cli_refuses_a_bad_rule_list_in_one_line(capsys, tmp_path, cmd):
    argv = [cmd, str(tmp_path)] if cmd == "replay" else [cmd, "--out", str(tmp_path / "s")]
    rc = main([*argv, "--risk-rules", "bad_order,kill_switch,no_book,bad_book"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"dualhub {cmd}: error: risk rules must include reduce_only"), err


def _verdicts() -> list:
    """check() over the rule table, seeded fuzz cases (hostile books, states and intents) and reordered
    rule lists, and the loss stop's answers next to its limit (its exact path included)."""
    from tests.risk_fuzz import LIMITS as FUZZ_LIMITS
    from tests.risk_fuzz import NOW as FUZZ_NOW
    from tests.risk_fuzz import gen_cases

    out: list = [check(LIMITS, st, it, book, now)[1] for st, it, book, now, _ in RULE_CASES]
    rest = tuple(r for r in reversed(DEFAULT_RULES) if r not in MANDATORY_RULES)
    reordered = replace(FUZZ_LIMITS, rules=(*MANDATORY_RULES, *rest))
    for st, its, book in gen_cases(seed=5, n=150):
        out += [check(FUZZ_LIMITS, st, it, book, FUZZ_NOW)[1] for it in its]
        out += [check(reordered, st, it, book, FUZZ_NOW)[1] for it in its]
    for cash in (
        -(10 * 10**12) - 1,
        -(10 * 10**12),
        -(10 * 10**12) + 1,
        units(-11.0005),
        units(-11.0005) + 1,
    ):
        for pos in (0, units(0.01), 1 << 70):
            out.append(_loss_ok(10.0, pos, cash, (100.0 + 100.1) / 2))
    out.append(_loss_ok(10.0, units(0.01), 0, math.nan))
    return out


def test_the_rules_read_as_plain_python_give_the_compiled_verdicts():
    pure = as_plain_python("engine.risk.verdict", "tests.engine.test_risk._verdicts")
    compiled = _verdicts()
    assert pure == compiled
    assert set(REASONS) <= set(compiled) and {True, False} <= set(compiled)  # every rule was reached


def test_a_replay_runs_the_configured_rules_on_both_paths_and_records_them(tmp_path):
    import orjson
    import pyarrow.parquet as pq

    from replay.config import ReplayConfig
    from replay.driver import run_replay
    from venue.simulator import simulate_session

    def reasons(run) -> set:
        return set(
            pq.read_table(run.run_dir / "events" / "risk.parquet", columns=["reason"]).column(0).to_pylist()
        )

    def read(run, name: str) -> dict:
        return orjson.loads((run.run_dir / name).read_bytes())

    session = simulate_session(tmp_path / "s", minutes=0.5, seed=23)
    tight = RiskLimits(max_orders_per_s=1)
    base = run_replay(session, ReplayConfig(risk=tight), out_dir=tmp_path / "base")
    assert "order_rate" in reasons(base)
    rules = tuple(r for r in DEFAULT_RULES if r != "order_rate")
    cfg = ReplayConfig(risk=replace(tight, rules=rules))
    kn = run_replay(session, cfg, out_dir=tmp_path / "k")
    py = run_replay(session, cfg, out_dir=tmp_path / "p", kernel=False)
    assert kn.path.startswith("kernel") and py.path.startswith("python") and kn.digest == py.digest
    assert "order_rate" not in reasons(kn) and kn.digest != base.digest
    assert read(kn, "runtime.json")["risk_rules"] == list(rules)
    assert read(base, "runtime.json")["risk_rules"] == list(DEFAULT_RULES)
    # a list other than the default is part of the run's config (its name); the default leaves it as it was
    assert read(kn, "manifest.json")["config"]["risk"]["rules"] == list(rules)
    assert "rules" not in read(base, "manifest.json")["config"]["risk"]


# ---------------------------------------------------------------- the holes an independent fuzz found
# Each case with the numbers it was found with; default limits unless stated.

DEFAULTS = RiskLimits()


def _book(
    bid: float, ask: float, *, ts: int = NOW, bid_sz: float = 1.0, ask_sz: float = 1.0, tick: float = 0.1
):
    book = make_book(bid, ask, ts=ts, tick=tick)
    return replace(book, bid_sz=(bid_sz,) * 15, ask_sz=(ask_sz,) * 15)


def test_a_book_with_no_valid_time_is_stale_never_fresh():
    """A: ``ts_recv = -(2**63)`` (INT64_MIN, the usual NaT) made ``now - ts_recv`` overflow into a
    fresh-looking age, and a buy of 0.001 passed; a book stamped an hour ahead passed too. Times past
    int64 (book, clock or advice) are refused, never raised."""
    book = _book(100.0, 100.1)
    buy = limit(qty=0.001)
    assert check(DEFAULTS, RiskState(), buy, book, NOW) == (True, "ok")
    for ts in (-(2**63), -1, NOW + 3_600_000_000_000, NOW + 1, 2**63 - 1, 2**64, -(2**70)):
        assert check(DEFAULTS, RiskState(), buy, replace(book, ts_recv=ts), NOW) == (False, "stale_book"), ts
    for now in (2**63, 2**64, -(2**64)):
        assert check(DEFAULTS, RiskState(), buy, book, now) == (False, "stale_book"), now
    old = market(source="kev", advice_age_ns=2**63)
    assert check(DEFAULTS, RiskState(), old, book, NOW) == (False, "stale_advice")
    assert check(DEFAULTS, RiskState(), market(source="kev", advice_age_ns=-(2**64)), book, NOW) == (
        False,
        "stale_advice",
    )


def test_a_short_book_is_refused_before_any_walk():
    """B: a 5-level book (bid sizes 0.001, ask sizes 1.0) and a market sell of 0.005: the walk read past
    the bids into the asks' sizes and accepted a fill whose true slippage is 25 bps against 5."""
    full = _book(100.0, 100.1, bid_sz=0.001)
    short = BookSnapshot(
        ts_event=NOW,
        ts_recv=NOW,
        seq=1,
        symbol="BTCUSDT",
        exch_seq=1,
        bid_px=full.bid_px[:5],
        bid_sz=full.bid_sz[:5],
        ask_px=full.ask_px[:5],
        ask_sz=full.ask_sz[:5],
    )
    sell = market("sell", qty=0.005)
    assert check(DEFAULTS, RiskState(), sell, short, NOW) == (False, "bad_book")
    assert check(DEFAULTS, RiskState(), limit("sell", px=100.1, qty=0.001), short, NOW) == (False, "bad_book")
    # the full book walks five levels of 0.001 down to 99.6: 20 bps from the 100.05 mid, past 5
    assert check(DEFAULTS, RiskState(), sell, full, NOW) == (False, "max_slippage")
    empty = replace(short, bid_px=(), bid_sz=(), ask_px=(), ask_sz=())
    assert check(DEFAULTS, RiskState(), sell, empty, NOW) == (False, "bad_book")


def test_an_order_through_zero_is_judged_on_its_opening_part():
    """C: with the loss stop hit and a long of 0.01, a sell of 0.019 passed as "reducing" and opened a
    0.009 short; the same exemption let a flip land beyond max_position."""
    book = _book(100.0, 100.1)
    hit = RiskState(position_units=units(0.01), cash_units=units(-200.0))
    assert check(DEFAULTS, hit, market("sell", qty=0.019), book, NOW) == (False, "loss_stop")
    assert check(DEFAULTS, hit, market("sell", qty=0.02), book, NOW) == (False, "loss_stop")
    assert check(DEFAULTS, hit, market("sell", qty=0.01), book, NOW) == (True, "ok")  # to flat: reducing
    assert check(DEFAULTS, hit, market("sell", qty=0.009), book, NOW) == (True, "ok")
    # above max_position (0.05) after a limit was lowered: a sell of 0.115 would land at -0.055
    wide = replace(DEFAULTS, max_order_qty=1.0, max_net_delta_usd=1e6)
    over = RiskState(position_units=units(0.06))
    assert check(wide, over, limit("sell", px=100.0, qty=0.115), book, NOW) == (False, "max_position")
    assert check(wide, over, limit("sell", px=100.0, qty=0.11), book, NOW) == (True, "ok")  # lands at -0.05
    assert check(wide, over, limit("sell", px=100.0, qty=0.06), book, NOW) == (True, "ok")


def test_reduce_only_counts_resting_orders_on_its_own_side():
    """D: under the kill switch, long 0.02 with a 0.02 sell already resting, a flattening sell of 0.02
    passed: if both fill the position is short 0.02."""
    book = _book(100.0, 100.1)
    flat = market("sell", qty=0.02, reduce_only=True, source="flatten")
    resting = RiskState(position_units=units(0.02), open_sell_qty=0.02, kill_switch=True)
    assert check(DEFAULTS, resting, flat, book, NOW) == (False, "reduce_only")
    half = replace(resting, open_sell_qty=0.01)
    assert check(DEFAULTS, half, flat, book, NOW) == (False, "reduce_only")
    assert check(DEFAULTS, half, replace(flat, qty=0.01), book, NOW) == (True, "ok")
    assert check(DEFAULTS, replace(resting, open_sell_qty=0.0), flat, book, NOW) == (True, "ok")
    # resting buys (the other side) do not make a sell any less reducing
    assert check(DEFAULTS, replace(resting, open_sell_qty=0.0, open_buy_qty=0.02), flat, book, NOW) == (
        True,
        "ok",
    )


def test_positions_and_limits_round_to_the_safe_side():
    """A position of 0.0494 was taken as 49 lots, so a buy of 0.001 passed and ended at 0.0504 against
    0.05; a position of 0.0005 was one lot, so a reduce-only sell of 0.001 passed; a max_order_qty of
    0.0199999999999 let 0.02 through."""
    book = _book(100.0, 100.1)
    roomy = replace(DEFAULTS, max_net_delta_usd=1e6)
    assert check(roomy, RiskState(position_units=units(0.0494)), limit(qty=0.001), book, NOW) == (
        False,
        "max_position",
    )
    assert check(roomy, RiskState(position_units=units(0.049)), limit(qty=0.001), book, NOW) == (True, "ok")
    assert check(
        roomy, RiskState(position_units=units(0.0494)), limit("sell", px=100.1, qty=0.001), book, NOW
    ) == (
        True,
        "ok",
    )
    tiny = RiskState(position_units=units(0.0005))
    assert check(roomy, tiny, market("sell", qty=0.001, reduce_only=True), book, NOW) == (
        False,
        "reduce_only",
    )
    assert check(
        roomy, RiskState(position_units=units(0.0015)), market("sell", qty=0.001, reduce_only=True), book, NOW
    ) == (
        True,
        "ok",
    )
    just_under = replace(DEFAULTS, max_order_qty=0.0199999999999)
    assert check(just_under, RiskState(), limit(qty=0.02), book, NOW) == (False, "max_order_qty")
    assert check(just_under, RiskState(), limit(qty=0.019), book, NOW) == (True, "ok")
    # an open size between lots counts as the lots above it: 0.0495 long and 0.0005 open buy is 0.05
    state = RiskState(position_units=units(0.049), open_buy_qty=0.0005)
    assert check(roomy, state, limit(qty=0.001), book, NOW) == (False, "max_position")


def test_the_band_is_measured_from_the_true_mid_of_an_off_tick_book():
    """Tick 0.5, book 0.25 / 3.0: a buy limit at 1.5 passed a 10 bps band after the touch was snapped to
    ticks, although it is 769 bps from the true mid 1.625."""
    book = make_book(0.25, 3.0, ts=NOW, tick=0.5)
    band10 = replace(DEFAULTS, price_band_bps=10.0)
    assert check(band10, RiskState(), limit(px=1.5, qty=0.001), book, NOW, tick=0.5) == (False, "price_band")
    assert check(
        replace(DEFAULTS, price_band_bps=769.2), RiskState(), limit(px=1.5, qty=0.001), book, NOW, tick=0.5
    ) == (
        False,
        "price_band",
    )
    # 0.125 / 1.625 = 769.2307... bps: a band of 769.24 holds it
    assert check(
        replace(DEFAULTS, price_band_bps=769.24), RiskState(), limit(px=1.5, qty=0.001), book, NOW, tick=0.5
    ) == (
        True,
        "ok",
    )


def test_out_of_range_inputs_are_refused_with_a_reason():
    book = _book(100.0, 100.1)
    # Kev's "no advice" (-1) is no advice to act on
    assert check(DEFAULTS, RiskState(), market(source="kev", advice_age_ns=-1), book, NOW) == (
        False,
        "stale_advice",
    )
    assert check(DEFAULTS, RiskState(), market(source="kev", advice_age_ns=0), book, NOW) == (True, "ok")
    for src in ("QUOTE", "", "cancel", "rebalance"):
        assert check(DEFAULTS, RiskState(), limit(source=src), book, NOW) == (False, "bad_order"), src
    # a negative gross exposure of the other instruments is no exposure to add
    pf = replace(DEFAULTS, portfolio_max_gross_usd=10_000.0)
    assert check(pf, RiskState(others_gross_usd=-3_000.0), limit(), book, NOW) == (False, "portfolio_gross")
    assert check(pf, RiskState(others_gross_usd=3_000.0), limit(), book, NOW) == (True, "ok")
    # a rate of 2.5 a second allows two orders in the window, not three
    rate = replace(DEFAULTS, max_orders_per_s=2.5)
    two = RiskState(recent_order_ns=(NOW - 10, NOW - 20))
    assert check(rate, two, limit(), book, NOW) == (False, "order_rate")
    assert check(rate, RiskState(recent_order_ns=(NOW - 10,)), limit(), book, NOW) == (True, "ok")
    # sizes and prices that are no numbers, and positions past int64, are refused, never raised
    assert check(DEFAULTS, RiskState(), limit(qty=10**400), book, NOW) == (False, "bad_order")
    assert check(DEFAULTS, RiskState(), limit(px=-(10**400)), book, NOW) == (False, "bad_order")
    assert check(DEFAULTS, RiskState(position_units=10**40), limit(), book, NOW)[0] is False
    assert check(DEFAULTS, RiskState(open_buy_qty=math.nan), limit(), book, NOW) == (False, "max_position")


def test_an_unwinding_leg_is_never_refused_by_a_portfolio_rule():
    """A hedged pair being unwound: BTC long 0.06 (~6 kUSD) against ETH short (the others' delta
    -6 kUSD), net zero. Selling 0.02 BTC moves the portfolio's net delta to -2 kUSD, away from zero and
    past a 1 kUSD limit, until the ETH leg is bought back too: it sheds risk all the same and passes
    every portfolio rule, even with the portfolio's loss stop hit. Opening more BTC is refused."""
    book = _book(100_000.0, 100_000.1)
    pf = replace(
        DEFAULTS,
        max_net_delta_usd=1e6,
        portfolio_max_net_delta_usd=1_000.0,
        portfolio_max_gross_usd=20_000.0,
        portfolio_loss_stop_usd=50.0,
    )
    hedged = RiskState(position_units=units(0.06), others_delta_usd=-6_000.0, others_gross_usd=6_000.0)
    unwind = market("sell", qty=0.02, max_slippage_bps=50.0)
    assert check(pf, hedged, unwind, book, NOW) == (True, "ok")
    assert check(pf, replace(hedged, others_pnl_usd=-80.0), unwind, book, NOW) == (True, "ok")
    # the same sell when it opens (BTC flat): the portfolio's net delta rule refuses it
    assert check(pf, replace(hedged, position_units=0), unwind, book, NOW) == (False, "portfolio_net_delta")
    # a sell of 0.07 would flip BTC short 0.01: that opening part is judged as a new order (-7 kUSD net)
    wide = replace(pf, max_order_qty=0.1)
    assert check(wide, hedged, market("sell", qty=0.07, max_slippage_bps=50.0), book, NOW) == (
        False,
        "portfolio_net_delta",
    )
