"""The strategy's compiled rules (quote prices, Kev's target, the market order towards it) and the
contract's rounding they use."""

import json
import math
import os
import subprocess
import sys
from decimal import Decimal

import numpy as np
import pytest

from engine.contract import (
    ContractConfig,
    at_units,
    lots_below,
    room_for,
    round_exact,
    round_to_step,
    round_to_tick,
    ticks_from,
    whole_lots,
)
from engine.errors import DualhubError
from engine.strategies.baseline import quote_prices
from engine.strategies.quoter import desired_quotes
from engine.strategy import (
    BUY,
    NO_ORDER,
    SELL,
    QuoteConfig,
    kev_target,
    rebalance_order,
)
from tests.helpers import REPO, make_book

CFG = QuoteConfig(quote_qty=0.002, offset_ticks=1, label_skew_ticks=2, inventory_skew_ticks=4.0)
CONTRACT = ContractConfig()


def quotes(label="HOLD", position=0.0, target=0.0, max_position=0.05, bid=100.0, ask=100.5, **book):
    b = make_book(bid=bid, ask=ask, **book)
    qs = desired_quotes(
        CFG, CONTRACT, b, label=label, position=position, target=target, max_position=max_position
    )
    return {q.side: q.px for q in qs}


def test_neutral_quotes_sit_offset_ticks_behind_the_touch():
    assert quotes() == {"buy": 99.9, "sell": 100.6}


def test_the_label_leans_both_quotes_towards_its_side():
    assert quotes("LEAN_BUY") == {"buy": 100.1, "sell": 100.8}
    assert quotes("LEAN_SELL") == {"buy": 99.7, "sell": 100.4}
    assert quotes("EMERGENCY") == quotes("HOLD") == quotes("NOT_A_LABEL")


def test_inventory_above_kevs_target_shifts_quotes_down():
    # half of max_position too long: 2 ticks lower (inventory_skew_ticks * 0.5); at the target: neutral
    assert quotes(position=0.025, target=0.0) == {"buy": 99.7, "sell": 100.4}
    assert quotes(position=0.025, target=0.025) == quotes()


def test_a_quote_never_crosses_the_touch():
    # a strong lean into a one-tick spread stops one tick inside the other side
    got = quotes("LEAN_BUY", position=-0.04, target=0.04, bid=100.0, ask=100.1)
    assert got["buy"] == 100.0 and got["sell"] >= 100.1


def test_a_side_that_would_breach_max_position_is_not_quoted():
    assert set(quotes(position=0.049)) == {"sell"}
    assert set(quotes(position=-0.049)) == {"buy"}
    assert set(quotes(position=0.048)) == {"buy", "sell"}  # exactly at the limit after a fill is fine


def test_a_fill_exactly_to_a_large_limit_is_quoted():
    # 100780.964 + 7.994 is 100788.95800000001 in doubles: past the limit by their rounding alone
    for position, limit, sides in (
        (100780.964, 100788.958, {"buy", "sell"}),
        (100780.965, 100788.958, {"sell"}),  # one size step short of room for a buy
        (-100780.964, 100788.958, {"buy", "sell"}),
        (-100780.965, 100788.958, {"buy"}),
    ):
        b = make_book(bid=100.0, ask=100.5)
        cfg = QuoteConfig(quote_qty=7.994)
        for strategy in ("baseline", "imbalance_lean"):
            got = desired_quotes(
                cfg, CONTRACT, b, label="HOLD", position=position, target=0.0, max_position=limit,
                strategy=strategy,
            )  # fmt: skip
            assert {q.side for q in got} == sides, (strategy, position)


def test_room_for_counts_whole_lots_exactly_at_any_size():
    # the limit exactly reached after a fill is room; one lot past it is not; sizes far past what
    # doubles hold to a lot's precision (2**53 of 1e-3 steps) stay exact
    big = 2**60
    assert room_for(100_780_964, 7_994, 100_788_958) == (True, True)
    assert room_for(100_780_965, 7_994, 100_788_958) == (False, True)
    assert room_for(-100_780_965, 7_994, 100_788_958) == (True, False)
    assert room_for(big - 1, 1, big) == (True, True) and room_for(big, 1, big) == (False, True)


def test_sizes_between_two_lots_are_refused_and_limits_count_whole_lots():
    assert whole_lots(7.994, 0.001, "quote_qty") == 7994
    assert whole_lots(10.0, 1.0, "quote_qty") == 10
    for bad in (0.0025, 0.0, -0.002, math.nan, math.inf):
        with pytest.raises(
            DualhubError, match=r"^quote_qty .* is not a whole number of size steps \(0.001\)$"
        ):
            whole_lots(bad, 0.001, "quote_qty")
    assert lots_below(0.0505, 0.001) == 50 and lots_below(0.05, 0.001) == 50
    assert lots_below(100788.958, 0.001) == 100_788_958  # 100788.958 / 0.001 is 100788957.99999999
    assert lots_below(math.inf, 0.001) == 1 << 62 and lots_below(-1.0, 0.001) == 0


@pytest.mark.parametrize(
    "bid, ask, size",
    [
        (math.nan, 100.5, 1.0),
        (100.0, math.inf, 1.0),
        (100.5, 100.0, 1.0),
        (100.0, 100.0, 1.0),
        (100.0, 100.5, 0.0),
    ],
)
def test_no_quotes_around_a_book_that_is_not_tradable(bid, ask, size):
    assert quotes(bid=bid, ask=ask, size=size) == {}


def test_no_quotes_past_2_52_ticks():
    tick = CONTRACT.tick
    top = 2.0**52 * tick
    below = quote_prices(top / 2 - 1e3, 1.0, top / 2, 1.0, tick, 0, 0, 0.0, 50, 2, 1, 2, 4.0)
    beyond = quote_prices(top - 1e3, 1.0, top, 1.0, tick, 0, 0, 0.0, 50, 2, 1, 2, 4.0)
    assert below[0] == below[2] == 2 and 0 < below[1] < below[3] == 2**51 + 1
    assert beyond == (0, 0, 0, 0)


def test_quote_prices_are_on_the_tick_even_where_round_is_wide():
    # from 2**52 / 1e10 on, round(x, 10) needs more than the simple exact product
    for bid in (450_360.3, 612_345.7, 3_000_000.1):
        got = quotes(bid=bid, ask=round(bid + 0.5, 1))
        for side, px in got.items():
            assert px == float(f"{px:.1f}"), (bid, side, px)


def test_kevs_target_while_fresh_within_max_position():
    assert kev_target(True, 10, 10, False, 0.03, 0.05) == 0.03
    assert kev_target(True, 10, 10, False, 0.3, 0.05) == 0.05
    assert kev_target(True, 10, 10, False, -0.3, 0.05) == -0.05
    assert kev_target(True, 11, 10, False, 0.03, 0.05) == 0.0  # expired
    assert kev_target(True, 10, 10, True, 0.03, 0.05) == 0.0  # flatten
    assert kev_target(False, 10, 10, False, 0.03, 0.05) == 0.0  # no advice


def test_rebalance_order_towards_the_target():
    args = (0.002, 0.01, 0.001, 0.001)  # quote_qty, max_order_qty, size_step, min_qty
    assert rebalance_order(0.0299, 0, *args) == (BUY, 0.01)  # capped at max_order_qty
    assert rebalance_order(-0.0047, 0, *args) == (SELL, 0.004)  # down to the size step
    assert rebalance_order(0.0, 3, *args) == (SELL, 0.003)  # the position in lots
    assert rebalance_order(0.0053, 2, *args) == (BUY, 0.003)
    assert rebalance_order(0.0019, 0, *args)[0] == NO_ORDER  # under one quote
    assert rebalance_order(0.0025, 0, 0.002, 0.01, 0.001, 0.003)[0] == NO_ORDER  # rounds below min_qty
    assert rebalance_order(0.05, 0, 0.002, math.inf, 0.001, 0.001) == (BUY, 0.05)  # no order limit
    assert rebalance_order(math.nan, 0, *args)[0] == NO_ORDER


def test_rebalance_gap_is_counted_in_lots_at_any_size():
    # a gap of exactly one quote (7.994) from a position of 100780.964: in base units the difference
    # of the two doubles is 7.993999999991502, under the quote and under 7.994's lots; in lots it is
    # the 7994 lots it is
    pos_lots, target, quote = 100_780_964, 100788.958, 7.994
    assert target - 100780.964 < quote - 1e-12  # what the float rule compared
    assert rebalance_order(target, pos_lots, quote, 10.0, 0.001, 0.001) == (BUY, 7.994)
    assert rebalance_order(-target, -pos_lots, quote, 10.0, 0.001, 0.001) == (SELL, 7.994)
    assert rebalance_order(target - 0.001, pos_lots, quote, 10.0, 0.001, 0.001)[0] == NO_ORDER


@pytest.mark.parametrize("nd", [0, 2, 6, 10, 12, 22])
def test_round_exact_is_cpythons_round_everywhere(nd):
    rng = np.random.default_rng(nd)
    base = 2.0**52 / 10.0**nd  # from here pyround gives up; round_exact must not
    xs = np.concatenate(
        [
            rng.uniform(0, 1, 3000) * base,
            base * rng.uniform(0.5, 4.0, 3000),
            np.floor(base * rng.uniform(0.5, 4.0, 2000)) + rng.integers(0, 4096, 2000) / 4096,  # ties
            [2.0**53 / 10.0**nd, np.nextafter(2.0**53 / 10.0**nd, 0), 1e300, 5e-324, 0.0],
        ]
    )
    for x in [*xs.tolist(), *(-xs).tolist()]:
        got, want = round_exact(x, nd), round(x, nd)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (x, nd, got, want)


@pytest.mark.parametrize("tick", [0.1, 0.01, 0.5, 1e-4, 0.25, 1.0, 5.0, 1e-8, 0.003])
def test_contract_rounding_lands_on_the_exact_decimal_grid(tick):
    """A price or size is a whole number of ticks or steps, as the double the exchange's string for
    it parses to, at every magnitude."""
    rng = np.random.default_rng(1)
    unit = Decimal(repr(tick))
    for px in [0.04, -0.04, -0.0, *rng.uniform(-1e6, 1e7, 1000).tolist(), *rng.uniform(0, 2e5, 1000)]:
        got, want = round_to_tick(px, tick), float(Decimal(round(px / tick)) * unit)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (px, tick)
        assert float(str(got)) == got and Decimal(str(got)) % unit == 0, (px, tick, got)
    for q in [-0.0001, 0.0999999999, *rng.uniform(-2e6, 2e6, 300).tolist(), *rng.uniform(0, 0.1, 300)]:
        got, want = round_to_step(q, tick), float(Decimal(int(q / tick + 1e-9)) * unit)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (q, tick)
    for x in (math.nan, math.inf, -math.inf):
        assert math.isnan(round_to_tick(x, tick)) if math.isnan(x) else round_to_tick(x, tick) == x
        assert math.isnan(round_to_step(x, tick)) if math.isnan(x) else round_to_step(x, tick) == x


def test_a_quote_some_ticks_from_the_touch_is_taken_in_ticks():
    """A shift of a half tick rounds half-even in ticks, exactly; taken as ``bid + shift * tick`` the
    float noise tipped about one in seventeen of them the other way (9412.87 - 2.5 ticks of 0.01:
    9412.85). The quote stays a tick inside the other side; NaN in, no price (0 ticks) out."""
    rng = np.random.default_rng(3)
    for _ in range(3000):
        tick = float(rng.choice([0.1, 0.01, 0.5, 1e-4, 0.25]))
        unit = Decimal(repr(tick))
        k, spread = int(rng.integers(1, 10**7)), int(rng.integers(1, 6))
        bid, ask = float(k * unit), float((k + spread) * unit)
        shift = float(rng.integers(-20, 20)) + float(rng.choice([0.0, 0.5, 0.25]))
        want_bid = min(round(Decimal(k) + Decimal(shift)), k + spread - 1)  # Decimal rounds half-even
        want_ask = max(round(Decimal(k + spread) + Decimal(-shift)), k + 1)
        assert ticks_from(bid, shift, ask, tick, True) == want_bid, (bid, shift, tick)
        assert ticks_from(ask, -shift, bid, tick, False) == want_ask, (ask, shift, tick)
    assert at_units(ticks_from(9412.87, -2.5, 9412.9, 0.01, True), 0.01) == 9412.84
    assert round_to_tick(9412.87 + -2.5 * 0.01, 0.01) == 9412.85  # the float path's answer
    assert ticks_from(100.0, 5.0, 100.1, 0.1, True) == 1000  # never at or through the ask
    assert ticks_from(100.1, -5.0, 100.0, 0.1, False) == 1001
    for args in ((math.nan, 1.0, 100.1), (100.0, math.nan, 100.1), (100.0, -1.0, math.nan)):
        assert ticks_from(*args, 0.1, True) == 0  # no price


def test_large_prices_are_not_off_grid():
    """Float rounding to 10 decimals left prices from ~4.4e5 up an ulp off their tick (3998105.9 came
    out as 3998105.9000000004, a price Bitget refuses): in ticks they are the decimal itself."""
    assert round(39981059 * 0.1, 10) == 3998105.9000000004  # what the float arithmetic gives
    assert round_to_tick(3998105.9, 0.1) == 3998105.9
    assert repr(round_to_tick(524307.7, 0.1)) == "524307.7"
    assert repr(round_to_step(1234567.891, 0.001)) == "1234567.891"


_QUOTE_CASES = [
    (label, pos, target, bid)
    for label in ("HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY")
    for pos in (-0.049, -0.01, 0.0, 0.02, 0.049)
    for target in (-0.05, 0.0, 0.03)
    for bid in (100.0, 37_000.1, 450_360.3, 900_720.1)
]
_QUOTE_SCRIPT = """
import json, sys
from engine.contract import ContractConfig
from engine.strategies.quoter import desired_quotes
from engine.strategy import QuoteConfig
from tests.helpers import make_book
out = []
for label, pos, target, bid in json.loads(sys.argv[1]):
    book = make_book(bid=bid, ask=bid + 0.3)
    qs = desired_quotes(QuoteConfig(), ContractConfig(), book, label=label, position=pos, target=target,
                        max_position=0.05)
    out.append([[q.side, q.px.hex(), q.qty] for q in qs])
print(json.dumps(out))
"""


def _quotes_in_subprocess(disable_jit: bool) -> list:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1" if disable_jit else "0"}
    root = REPO
    r = subprocess.run(
        [sys.executable, "-c", _QUOTE_SCRIPT, json.dumps(_QUOTE_CASES)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_quoting_as_plain_python_gives_the_compiled_quotes():
    plain, compiled = _quotes_in_subprocess(True), _quotes_in_subprocess(False)
    assert plain == compiled
    assert sum(len(q) for q in plain) > len(_QUOTE_CASES)  # most cases quote, some one side only
