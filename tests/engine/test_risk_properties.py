"""Property-based tests: Kev command validation, the quoting strategy and the risk gateway over random
and adversarial inputs (NaN, inf, negative, zero, crossed, one-sided, huge). Accepted orders are audited
by an oracle that does not use the gateway's code (tests/risk_fuzz.py); bench/fuzz_risk.py runs the
same audit over millions of cases."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.book import tradable
from engine.contract import ContractConfig, round_to_tick, step_parts
from engine.events import BookSnapshot
from engine.kev.command import (
    HEDGE_RATIO_RANGE,
    MAX_SLIPPAGE_BPS_RANGE,
    TARGET_POSITION_ABS_MAX,
    CommandFields,
    validate_command,
)
from engine.risk import (
    DEFAULT_RULES,
    MANDATORY_RULES,
    N_RULES,
    OrderIntent,
    RiskLimits,
    RiskState,
    check,
    rule_codes,
)
from engine.risk import entry as risk_entry
from engine.strategies.quoter import desired_quotes
from replay import kernel as K
from tests.helpers import make_book
from tests.risk_fuzz import CONTRACT, LIMITS, NOW, QUOTES, book_of, breaches, gen_cases, run_fuzz

SETTINGS = settings(
    max_examples=400, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)

# numbers as an adversary picks them: the edges, non-finite values, and ordinary ones
hostile_float = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-300, 1e300, 1.7e308, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=1e-3, max_value=1e6),
)
price = st.one_of(st.floats(min_value=0.1, max_value=200_000.0), hostile_float)
size = st.one_of(st.sampled_from([0.001, 0.01, 0.5, 3.0]), hostile_float)


@st.composite
def books(draw: st.DrawFn) -> BookSnapshot:
    """Mostly a plausible 15-level book around a drawn mid; any top value may be hostile instead."""
    mid = draw(st.floats(min_value=1.0, max_value=100_000.0))
    spread = draw(st.sampled_from([0.1, 0.2, 1.0]))
    bid = round(mid, 1)
    bid_px = [bid - i * 0.1 for i in range(15)]
    ask_px = [bid + spread + i * 0.1 for i in range(15)]
    bid_sz = [draw(st.sampled_from([0.001, 0.01, 1.0])) for _ in range(15)]
    ask_sz = list(bid_sz)
    for arr, values in ((bid_px, price), (ask_px, price), (bid_sz, size), (ask_sz, size)):
        if draw(st.integers(0, 4)) == 0:
            arr[draw(st.integers(0, 14)) if draw(st.booleans()) else 0] = draw(values)
    if draw(st.integers(0, 9)) == 0:  # one-sided
        (bid_px if draw(st.booleans()) else ask_px)[:] = [math.nan] * 15
    if draw(st.integers(0, 9)) == 0:  # crossed
        bid_px[0] = ask_px[0] + 0.1
    return book_of(
        bid_px, bid_sz, ask_px, ask_sz, NOW - draw(st.sampled_from([0, 0, 0, 1_000, 3_000_000_000]))
    )


lots = st.integers(-150, 150).map(lambda n: n / 1000)
states = st.builds(
    RiskState,
    position_units=st.integers(-150, 150).map(lambda n: n * 10**9),
    open_buy_qty=st.integers(0, 120).map(lambda n: n / 1000),
    open_sell_qty=st.integers(0, 120).map(lambda n: n / 1000),
    # cash in units of 1e-12: round amounts, any amount, and amounts beyond what the kernel holds
    cash_units=st.one_of(
        st.sampled_from([0, -99, -100, -1_000_000, 5_000]).map(lambda n: n * 10**12),
        st.integers(-(10**16), 10**16),
        st.integers(-(10**40), 10**40),
    ),
    recent_order_ns=st.lists(st.integers(NOW - 2_000_000_000, NOW), max_size=12).map(
        lambda v: tuple(sorted(v))
    ),
    kill_switch=st.sampled_from([False] * 15 + [True]),
    others_delta_usd=st.sampled_from([0.0, 0.0, 3_000.0, -5_900.0, 12_000.0, math.nan]),
    others_gross_usd=st.sampled_from([0.0, 0.0, 5_000.0, 8_990.0, math.nan]),
    others_pnl_usd=st.sampled_from([0.0, 0.0, -150.0, -205.0, math.inf, math.nan]),
)
intents = st.builds(
    OrderIntent,
    client_oid=st.just("p"),
    symbol=st.just("BTCUSDT"),
    intent=st.sampled_from(["new"] * 8 + ["cancel", "amend"]),
    side=st.sampled_from(["buy", "sell"] * 4 + ["BUY"]),
    order_type=st.sampled_from(["limit", "market"] * 4 + ["stop"]),
    px=price,
    qty=st.one_of(st.integers(1, 25).map(lambda n: n / 1000), size),
    reduce_only=st.booleans(),
    max_slippage_bps=st.none() | hostile_float,
    source=st.sampled_from(["quote", "kev", "flatten"]),
    advice_age_ns=st.sampled_from([-1, 0, 1_000_000, 3_000_000_001]),
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[RiskState, OrderIntent, BookSnapshot]:
    """A state, an intent and a book; the intent's price is often near the book's mid, mostly on the
    tick grid, so that orders get as far as the price band, the slippage and the loss stop."""
    book, intent = draw(books()), draw(intents)
    if draw(st.booleans()):
        mid = (book.bid_px[0] + book.ask_px[0]) / 2
        px = mid * (1 + draw(st.integers(-80, 80)) / 1e4)
        on_grid = draw(st.integers(0, 3)) > 0
        intent = replace(intent, px=round_to_tick(px, ContractConfig().tick) if on_grid else px)
    return draw(states), intent, book


@SETTINGS
@given(limits_scale=st.sampled_from([0.2, 1.0, 5.0]), case=cases())
def test_an_accepted_order_never_breaches_a_limit(limits_scale, case):
    state, intent, book = case
    limits = RiskLimits(
        max_position=0.05 * limits_scale,
        max_net_delta_usd=5_000.0 * limits_scale,
        max_order_qty=0.02 * limits_scale,
        max_slippage_bps=5.0 * limits_scale,
        price_band_bps=50.0 * limits_scale,
    )
    ok, reason = check(limits, state, intent, book, NOW)
    assert ok == (reason == "ok")
    if ok and intent.intent == "new":
        assert breaches(limits, state, intent, book) == []
        assert tradable(book)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=200),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=12,
)
command_like = st.fixed_dictionaries(
    {
        "action": st.sampled_from(["HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY_FLATTEN"]) | json_values,
        "target_position": hostile_float | st.integers(-(10**400), 10**400) | json_values,
        "hedge_ratio": hostile_float | json_values,
        "max_slippage_bps": hostile_float | json_values,
        "reason": st.text(max_size=150) | json_values,
    },
    optional={"extra": json_values, 7: json_values},  # type: ignore[dict-item]
)


@SETTINGS
@given(obj=json_values | command_like)
def test_command_validation_never_raises_and_bounds_what_it_accepts(obj):
    verdict = validate_command(obj)
    assert isinstance(verdict, CommandFields | str)
    if isinstance(verdict, CommandFields):
        assert abs(verdict.target_position) <= TARGET_POSITION_ABS_MAX
        assert HEDGE_RATIO_RANGE[0] <= verdict.hedge_ratio <= HEDGE_RATIO_RANGE[1]
        assert MAX_SLIPPAGE_BPS_RANGE[0] <= verdict.max_slippage_bps <= MAX_SLIPPAGE_BPS_RANGE[1]
    else:
        assert verdict and "\n" not in verdict


def test_an_integer_beyond_float_range_is_a_reason_not_an_overflow():
    cmd = {
        "action": "HOLD",
        "target_position": 10**400,
        "hedge_ratio": 0.5,
        "max_slippage_bps": 5,
        "reason": "",
    }
    assert validate_command(cmd) == "target_position is too large"


@SETTINGS
@given(
    book=books(), label=st.sampled_from(["HOLD", "LEAN_BUY", "LEAN_SELL", "EMERGENCY"]), pos=lots, target=lots
)
def test_the_strategy_quotes_only_on_a_tradable_book(book, label, pos, target):
    quotes = desired_quotes(
        QUOTES, CONTRACT, book, label=label, position=pos, target=target, max_position=LIMITS.max_position
    )
    if not tradable(book):
        assert quotes == []
    for q in quotes:
        assert math.isfinite(q.px) and q.qty == QUOTES.quote_qty


def test_a_seeded_fuzz_of_commands_strategy_and_risk_finds_no_breach():
    stats = run_fuzz(seed=16, n=4_000)
    assert stats.breaches == {}, stats.examples[:2]
    # the run exercised every rule an adversarial case can reach, and still let real orders through
    for reason in ("ok", "bad_book", "bad_order", "max_position", "max_net_delta", "price_band"):
        assert stats.reasons[reason] > 0, reason
    for reason in ("max_slippage", "reduce_only", "max_order_qty", "loss_stop", "stale_book"):
        assert stats.reasons[reason] > 0, reason
    for reason in ("portfolio_net_delta", "portfolio_gross", "portfolio_loss_stop"):
        assert stats.reasons[reason] > 0, reason


# ---------------------------------------------------------------- the compiled gateway agrees


def _kernel_check(
    limits: RiskLimits, state: RiskState, it: OrderIntent, book: BookSnapshot, entry: int | None = None
) -> str | None:
    """The replay kernel's ``_check_new`` on the same inputs, calling the rules at ``entry`` (their
    compiled entry by default); None for money beyond the kernel's bounds (such a run is the Python
    engine's)."""
    S = np.zeros(K.S_SIZE, dtype=np.int64)
    C = np.zeros(K.C_SIZE, dtype=np.int64)
    CF = np.zeros(K.CF_SIZE, dtype=np.float64)
    C[K.C_MAX_ADVICE_AGE], C[K.C_STALE_BOOK] = limits.max_advice_age_ns, limits.stale_book_ns
    C[K.C_MAX_ORDERS_PER_S] = limits.max_orders_per_s
    C[K.C_RISK_RULES : K.C_RISK_RULES + N_RULES] = rule_codes(limits)
    C[K.C_RISK_FN] = risk_entry() if entry is None else entry  # the core calls the rules there
    for i, v in (
        (K.CF_MAX_ORDER_QTY, limits.max_order_qty),
        (K.CF_MAX_POSITION, limits.max_position),
        (K.CF_MAX_DELTA, limits.max_net_delta_usd),
        (K.CF_BAND, limits.price_band_bps),
        (K.CF_MAX_SLIP, limits.max_slippage_bps),
        (K.CF_LOSS_STOP, limits.daily_loss_stop_usd),
        (K.CF_PF_MAX_DELTA, limits.portfolio_max_net_delta_usd),
        (K.CF_PF_MAX_GROSS, limits.portfolio_max_gross_usd),
        (K.CF_PF_LOSS_STOP, limits.portfolio_loss_stop_usd),
        (K.CF_SIZE_STEP, ContractConfig().size_step),  # the step check() walks the book in
        (K.CF_TICK, ContractConfig().tick),  # and the tick it reads prices in
    ):
        CF[i] = v
    SF = np.zeros(K.SF_SIZE, dtype=np.float64)
    SF[K.SF_OTHERS_DELTA] = state.others_delta_usd
    SF[K.SF_OTHERS_GROSS] = state.others_gross_usd
    SF[K.SF_OTHERS_PNL] = state.others_pnl_usd
    S[K.S_KILL], S[K.S_ENG_BOOK], S[K.S_ENG_ROW] = int(state.kill_switch), 1, 0
    cash_hi, cash_lo = divmod(state.cash_units, 1 << 32)
    if abs(cash_hi) > 1 << 53:
        return None  # the kernel's money bound (_on_fill): no run of it holds such cash
    C[K.C_STEP_NUM], C[K.C_STEP_DEC] = step_parts(ContractConfig().size_step)
    lot = 10**12 // 1000  # the default contract's lot in 1e-12 base units
    i64 = range(-(2**63), 2**63)
    if (
        state.position_units % lot != 0  # the core holds whole lots, int64 times, full books, known codes
        or any(round(q * 1000) != q * 1000 for q in (state.open_buy_qty, state.open_sell_qty))
        or book.ts_recv not in i64
        or it.advice_age_ns not in i64
        or it.source not in ("quote", "kev", "flatten")
        or any(len(x) != 15 for x in (book.bid_px, book.bid_sz, book.ask_px, book.ask_sz))
    ):
        return None  # what only the Python adapter can be handed (its own tests refuse each)
    S[K.S_POS], S[K.S_CASH_HI], S[K.S_CASH_LO] = state.position_units // lot, cash_hi, cash_lo
    OI = np.zeros((16, K.OI_COLS), dtype=np.int64)
    OF = np.zeros((16, K.OF_COLS), dtype=np.float64)
    work = np.zeros(3 * K.WORK_CAP, dtype=np.int64)
    n = 0
    for oid, side, qty in ((1, K.BUY, state.open_buy_qty), (2, K.SELL, state.open_sell_qty)):
        if qty > 0:
            OI[oid, K.OI_SIDE], OI[oid, K.OI_LOTS] = side, round(qty * 1000)
            work[n] = oid
            n += 1
    S[K.S_NWORK] = n
    recent = np.zeros(limits.max_orders_per_s + 16, dtype=np.int64)
    recent[: len(state.recent_order_ns)] = state.recent_order_ns
    S[K.S_RECENT_TAIL] = len(state.recent_order_ns)
    eng_book = np.array([*book.bid_px, *book.bid_sz, *book.ask_px, *book.ask_sz], dtype=np.float64)
    reason = K._check_new(
        S, SF, C, CF, OI, OF, work, recent, eng_book, np.array([book.ts_recv], dtype=np.int64),
        K.BUY if it.side == "buy" else K.SELL, K.LIMIT if it.order_type == "limit" else K.MARKET,
        it.px, it.qty, it.reduce_only, math.nan if it.max_slippage_bps is None else it.max_slippage_bps,
        {"quote": K.SRC_QUOTE, "kev": K.SRC_KEV, "flatten": K.SRC_FLATTEN}[it.source], it.advice_age_ns,
        NOW, np.zeros(15), np.zeros(15),
    )  # fmt: skip
    return None if S[K.S_WHY] != K.U_NONE else K.REASON_TEXT[reason]


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_the_compiled_gateway_gives_the_same_verdict(case):
    state, intent, book = case
    if (
        intent.intent != "new"
        or intent.side not in ("buy", "sell")
        or intent.order_type not in ("limit", "market")
    ):
        return  # the kernel's intents are typed codes: these exist only as Python strings
    if intent.max_slippage_bps is not None and math.isnan(intent.max_slippage_bps):
        return  # the kernel's "no command limit" is NaN
    got = _kernel_check(LIMITS, state, intent, book)
    if got is not None:
        assert got == check(LIMITS, state, intent, book, NOW)[1]


# the mandatory rules, then the others backwards; and the mandatory ones alone
OTHERS = tuple(r for r in DEFAULT_RULES[::-1] if r not in MANDATORY_RULES)
REORDERED = replace(LIMITS, rules=(*MANDATORY_RULES, *OTHERS))
MANDATORY_ONLY = replace(LIMITS, rules=MANDATORY_RULES)


@pytest.mark.parametrize(
    "limits", [LIMITS, REORDERED, MANDATORY_ONLY], ids=["default", "reordered", "mandatory"]
)
def test_the_compiled_gateway_agrees_on_the_seeded_fuzz_cases(limits):
    verdicts: Counter[str] = Counter()
    for state, its, book in gen_cases(seed=17, n=1_500):
        for it in its:
            if it.max_slippage_bps is not None and math.isnan(it.max_slippage_bps):
                continue
            got = _kernel_check(limits, state, it, book)
            if got is not None:
                assert got == check(limits, state, it, book, NOW)[1], (state, it, book)
                verdicts[got] += 1
    assert verdicts["ok"] > 100 and len(verdicts) >= (10 if limits is not MANDATORY_ONLY else 5), verdicts
    assert set(verdicts) <= {"ok", *limits.rules}, verdicts  # no rule outside the list ever answers


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0])
def test_both_gateways_refuse_a_bad_top_of_book(bad):
    book = make_book(50_000.0, 50_000.1, ts=NOW)
    book = replace(book, ask_px=(bad, *book.ask_px[1:]))
    buy = OrderIntent(
        client_oid="p", symbol="BTCUSDT", intent="new", side="buy", order_type="limit", px=1e9, qty=0.001
    )
    assert check(LIMITS, RiskState(), buy, book, NOW) == (False, "bad_book")
    assert _kernel_check(LIMITS, RiskState(), buy, book) == "bad_book"


def test_a_core_without_the_rules_entry_stops_with_a_clear_error():
    """A core whose state names no entry for the rules (an address of 0) refuses to decide, with an
    error that says so, instead of jumping to address 0."""
    buy = OrderIntent(
        client_oid="p", symbol="BTCUSDT", intent="new", side="buy", order_type="limit", px=50_000.0, qty=0.001
    )
    with pytest.raises(ValueError, match="risk rules' entry needs its address"):
        _kernel_check(LIMITS, RiskState(), buy, make_book(50_000.0, 50_000.1, ts=NOW), entry=0)
