"""Risk gateway: deterministic pre-trade rules between every order intent and the exchange.

Each rule is a small compiled function below, named by :data:`RULES` and coded by its rejection reason
(an index into :data:`REASONS`). :func:`verdict` runs the configured list of codes in order
(``RiskLimits.rules``, default :data:`DEFAULT_RULES`): the first failing rule names the rejection.
Its inputs are plain numbers and arrays, so the replay kernel calls it on its own state, and the Python
engine through :func:`check`, the pure ``(limits, state, intent, book, now_ns) -> (accepted, reason)``
adapter (or :func:`verdict_of` with arrays it keeps); the caller turns the verdict into a
``RiskDecision`` event, so every decision is on the record. A rule holds when its comparison does
(``value <= limit``) and the verdict rejects on ``not rule``, so a NaN anywhere rejects instead of
passing. Sizes reach the rules in whole lots of the size step and prices are compared in ticks, so the
size, band and slippage rules are exact integers at their edge; the loss stop reads position and cash
as the integers of 1e-12 the engine keeps, and is decided exactly (:func:`loss_ok`). With
``NUMBA_DISABLE_JIT=1`` the rules run as plain Python: the readable reference of the compiled code.

The decision core calls :func:`verdict` through the address of its compiled entry (:func:`entry`), so
it does not compile the rules into itself: an edited rule recompiles the entry alone
(``engine/risk_call.py``).

To add a rule: a compiled function here, a reason in ``REASONS`` (its code and name, in
``engine/risk_codes.py``), a branch in :func:`verdict`, and, if it should run by default, a place in
:data:`DEFAULT_RULES`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from typing import Final

import numba as nb
import numpy as np
from numba import carray

from engine.book import LEVELS, WIDTH, as_levels, tradable_top, walk_levels
from engine.contract import ContractConfig, at_units, grid, lots_of, on_tick_grid, tick_index
from engine.errors import DualhubError
from engine.events import BookSnapshot, Nanos
from engine.exact import pmin
from engine.jit import cfunc, njit
from engine.risk_codes import (  # noqa: F401 - the gateway's codes, read as engine.risk's too
    BUY,
    ENTRY_SIGNATURE,
    L_LOSS_STOP,
    L_MAX_ADVICE_AGE,
    L_MAX_NET_DELTA,
    L_MAX_ORDER_QTY,
    L_MAX_ORDERS_PER_S,
    L_MAX_POSITION,
    L_MAX_SLIPPAGE,
    L_PF_LOSS_STOP,
    L_PF_MAX_DELTA,
    L_PF_MAX_GROSS,
    L_PRICE_BAND,
    L_SIZE,
    L_STALE_BOOK,
    LIMIT,
    MARKET,
    N_RULES,
    R_BAD_BOOK,
    R_BAD_ORDER,
    R_BAND,
    R_KILL,
    R_LOSS,
    R_MAX_DELTA,
    R_MAX_POS,
    R_MAX_QTY,
    R_NO_BOOK,
    R_OK,
    R_PF_DELTA,
    R_PF_GROSS,
    R_PF_LOSS,
    R_RATE,
    R_REDUCE_ONLY,
    R_SLIP,
    R_STALE_ADVICE,
    R_STALE_BOOK,
    RATE_WINDOW_NS,
    REASONS,
    RULES,
    SELL,
    SRC_CANCEL,
    SRC_FLATTEN,
    SRC_KEV,
    SRC_QUOTE,
    VF_ASK,
    VF_ASK_SZ,
    VF_BID,
    VF_BID_SZ,
    VF_OTHERS_DELTA,
    VF_OTHERS_GROSS,
    VF_OTHERS_PNL,
    VF_PX,
    VF_QTY,
    VF_SIZE,
    VF_SLIP,
    VF_STEP,
    VF_TICK,
    VI_AGE,
    VI_BOOK_TS,
    VI_CASH_HI,
    VI_CASH_LO,
    VI_HAS_BOOK,
    VI_KILL,
    VI_NOW,
    VI_OPEN_BUY,
    VI_OPEN_SELL,
    VI_OTYPE,
    VI_POS_HI,
    VI_POS_LO,
    VI_POS_LOTS,
    VI_RECENT_N,
    VI_REDUCE,
    VI_SIDE,
    VI_SIZE,
    VI_SOURCE,
    lots_within,
    only_reduces,
)

DEFAULT_RULES: Final = (
    "bad_order",
    "kill_switch",
    "stale_advice",
    "no_book",
    "bad_book",
    "stale_book",
    "max_order_qty",
    "reduce_only",
    "max_position",
    "max_net_delta",
    "price_band",
    "max_slippage",
    "order_rate",
    "loss_stop",
    "portfolio_net_delta",
    "portfolio_gross",
    "portfolio_loss_stop",
)
# Never left out: without them a malformed order, an order under the kill switch, an order with no
# usable book to price it, or a "reduce-only" order that grows the position (the kill switch lets
# reduce-only flattening through, trusting this rule) could pass.
MANDATORY_RULES: Final = ("bad_order", "kill_switch", "no_book", "bad_book", "reduce_only")
# Rules that read the book: they run after no_book and bad_book, which guarantee a finite positive mid.
BOOK_RULES: Final = (
    "stale_book",
    "max_net_delta",
    "price_band",
    "max_slippage",
    "loss_stop",
    "portfolio_net_delta",
    "portfolio_gross",
    "portfolio_loss_stop",
)

_SIDES: Final = {"buy": BUY, "sell": SELL}
_TYPES: Final = {"limit": LIMIT, "market": MARKET}
_SOURCES: Final = {"quote": SRC_QUOTE, "kev": SRC_KEV, "flatten": SRC_FLATTEN, "cancel": SRC_CANCEL}


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskLimits:
    """Trading limits. Sizes in base units (BTC for BTCUSDT), money in USDT, times in ns."""

    max_position: float = 0.05
    max_net_delta_usd: float = 5_000.0
    max_order_qty: float = 0.02
    max_slippage_bps: float = 5.0
    price_band_bps: float = 50.0
    max_orders_per_s: int = 10
    stale_book_ns: Nanos = 2_000_000_000
    daily_loss_stop_usd: float = 100.0
    max_advice_age_ns: Nanos = 3_000_000_000  # orders acting on older Kev advice are refused
    # The portfolio's limits (every instrument one engine trades): net delta and gross exposure in USD,
    # the loss stop on the summed PnL. Infinite: a single-instrument run never binds on them.
    portfolio_max_net_delta_usd: float = math.inf
    portfolio_max_gross_usd: float = math.inf
    portfolio_loss_stop_usd: float = math.inf
    # the rules to run, in order (names of RULES; a comma-separated string is read too)
    rules: tuple[str, ...] = DEFAULT_RULES

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", checked_rules(self.rules))
        # `not (x > 0)` also refuses NaN, which would switch a rule off (every comparison is false).
        for name in (
            "max_position",
            "max_net_delta_usd",
            "max_order_qty",
            "max_slippage_bps",
            "price_band_bps",
            "daily_loss_stop_usd",
            "portfolio_max_net_delta_usd",
            "portfolio_max_gross_usd",
            "portfolio_loss_stop_usd",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"RiskLimits.{name} must be > 0")
        if not (self.max_orders_per_s > 0 and self.stale_book_ns > 0 and self.max_advice_age_ns > 0):
            raise ValueError("RiskLimits.max_orders_per_s, stale_book_ns and max_advice_age_ns must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderIntent:
    """What a strategy wants to do. ``px`` is NaN for market orders."""

    client_oid: str
    symbol: str
    intent: str  # "new" | "cancel"
    side: str  # "buy" | "sell"
    order_type: str  # "limit" | "market"
    px: float
    qty: float
    reduce_only: bool = False
    max_slippage_bps: float | None = None  # a command may tighten the gateway's limit, never widen it
    source: str = "quote"  # "quote" (strategy), "kev" (acting on a Kev command), "flatten"
    advice_age_ns: Nanos = -1  # age of the Kev command this order acts on; -1 when none


def checked_rules(rules: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``rules`` (names, or one comma-separated string of them) as a tuple, or a DualhubError (one line)
    naming what is wrong: an unknown or repeated name, a mandatory rule left out, an order that lets a
    rule read what the rules before it have not checked (``bad_order`` first; ``no_book``, then
    ``bad_book``, before the rules that read the book)."""
    names = tuple(r.strip() for r in rules.split(",")) if isinstance(rules, str) else tuple(rules)
    for r in names:
        if r not in RULES:
            raise DualhubError(f"unknown risk rule {r!r}; known: {', '.join(RULES)}")
        if names.count(r) > 1:
            raise DualhubError(f"risk rule {r!r} is listed twice")
    missing = [r for r in MANDATORY_RULES if r not in names]
    if missing:
        raise DualhubError(
            f"risk rules must include {', '.join(missing)} (never left out: {', '.join(MANDATORY_RULES)})"
        )
    if names[0] != "bad_order":
        raise DualhubError("risk rule 'bad_order' must come first: every other rule reads the order")
    first_book = min([names.index(r) for r in BOOK_RULES if r in names], default=len(names))
    if not names.index("no_book") < names.index("bad_book") < first_book:
        raise DualhubError(
            "risk rules 'no_book' then 'bad_book' must come before the rules that read the book: "
            + ", ".join(BOOK_RULES)
        )
    return names


def rule_codes(limits: RiskLimits) -> np.ndarray:
    """``limits.rules`` as the codes :func:`verdict` runs: N_RULES int64, in order, padded with R_OK."""
    a = np.zeros(N_RULES, dtype=np.int64)
    a[: len(limits.rules)] = [REASONS.index(r) for r in limits.rules]
    return a


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskState:
    """The slice of portfolio state the rules read. Money and position are integers of 1e-12
    (:func:`engine.portfolio.units`: the Portfolio's Decimals exactly)."""

    position_units: int = 0  # base units x 1e12
    open_buy_qty: float = 0.0
    open_sell_qty: float = 0.0
    cash_units: int = 0  # USDT x 1e12, net of fees, since the start of the day
    recent_order_ns: tuple[Nanos, ...] = ()  # send times of accepted new orders
    kill_switch: bool = False
    # the rest of the portfolio (the other instruments): net delta, gross exposure and PnL, in USD
    others_delta_usd: float = 0.0
    others_gross_usd: float = 0.0
    others_pnl_usd: float = 0.0

    @property
    def position(self) -> float:
        """The position in base units, as the rules read it (correctly rounded)."""
        return self.position_units / 10**12


def limits_array(limits: RiskLimits) -> np.ndarray:
    """``limits`` as the rules read them (``L_*`` indexes). Build it once per RiskLimits and keep it.

    Times and counts become floats: exact up to 2**53 ns (104 days)."""
    a = np.empty(L_SIZE)
    a[L_MAX_POSITION] = limits.max_position
    a[L_MAX_NET_DELTA] = limits.max_net_delta_usd
    a[L_MAX_ORDER_QTY] = limits.max_order_qty
    a[L_MAX_SLIPPAGE] = limits.max_slippage_bps
    a[L_PRICE_BAND] = limits.price_band_bps
    a[L_MAX_ORDERS_PER_S] = limits.max_orders_per_s
    a[L_STALE_BOOK] = limits.stale_book_ns
    a[L_LOSS_STOP] = limits.daily_loss_stop_usd
    a[L_MAX_ADVICE_AGE] = limits.max_advice_age_ns
    a[L_PF_MAX_DELTA] = limits.portfolio_max_net_delta_usd
    a[L_PF_MAX_GROSS] = limits.portfolio_max_gross_usd
    a[L_PF_LOSS_STOP] = limits.portfolio_loss_stop_usd
    return a


# ---------------------------------------------------------------- the rules (True: the order passes)


@njit
def well_formed(side, otype, px, qty, step, tick) -> bool:
    """A known side and type; a size of whole lots of the contract's size step ``step`` (exactly the
    double :func:`engine.contract.at_units` gives for them, as a decimal string of it parses: the
    exchange refuses any other size); for a limit order a price of whole ticks of ``tick``, likewise
    (:func:`engine.contract.on_tick_grid`): the core holds it as that many ticks."""
    if not ((side == BUY or side == SELL) and (otype == LIMIT or otype == MARKET)):
        return False
    lots = lots_of(qty, step)
    if not (1.0 <= lots < 2.0**52 and at_units(lots, step) == qty):
        return False
    return otype != LIMIT or on_tick_grid(px, tick)


@njit
def kill_switch_ok(kill, reduce_only, source) -> bool:
    """The kill switch stops everything but orders that can only close the position: reduce-only
    flattening (checked below like any order)."""
    return not kill or (reduce_only and source == SRC_FLATTEN)


@njit
def advice_fresh(lim, source, age) -> bool:
    return source != SRC_KEV or age <= lim[L_MAX_ADVICE_AGE]


@njit
def book_fresh(lim, book_ts, now) -> bool:
    return now - book_ts <= lim[L_STALE_BOOK]


@njit
def order_qty_ok(lim, lots, step) -> bool:
    return lots <= lots_within(lim[L_MAX_ORDER_QTY], step)


@njit
def worst_position(position, open_buy, open_sell, side, lots) -> float:
    """The position if every resting order on the order's side fills too; all in lots."""
    signed = lots if side == BUY else -lots
    open_same = open_buy if side == BUY else -open_sell
    return position + open_same + signed


@njit
def position_ok(lim, worst, step) -> bool:
    return abs(worst) <= lots_within(lim[L_MAX_POSITION], step)


@njit
def net_delta_ok(lim, worst_qty, mid) -> bool:
    return abs(worst_qty) * mid <= lim[L_MAX_NET_DELTA]


@njit
def mid_ticks2(bid, ask, tick) -> float:
    """Twice the mid in ticks of ``tick``: the sum of the touch's prices in ticks, an integer (as a
    double). The band and the slippage are measured on prices in ticks, as the core holds an order's
    price and the venue matches the book's, so an on-grid price is an exact integer and only the one
    product with the limit rounds. NaN unless positive and finite (the rules then fail closed, whatever
    ran before them)."""
    s = tick_index(bid, tick) + tick_index(ask, tick)
    return s if 0.0 < s < math.inf else math.nan


@njit
def in_price_band(lim, px, bid, ask, tick) -> bool:
    """The limit price ``px`` within the band around the mid: ``|px - mid| / mid`` in bps, as
    ``|2 px - (bid + ask)| / (bid + ask)`` in ticks."""
    s = mid_ticks2(bid, ask, tick)
    return abs(2.0 * tick_index(px, tick) - s) * 1e4 <= lim[L_PRICE_BAND] * s


@njit
def slippage_ok(lim, bk, step, tick, side, qty, slip, bid, ask, lpx, lq) -> bool:
    """The displayed depth fills all of a market order (in whole lots of the size step ``step``, as
    the simulated venue fills it), at an average price within the gateway's slippage limit or the
    order's own (``slip``; NaN: none) if tighter. The average is taken in ticks and lots, integers, so
    their sums are exact: ``|num / q - mid| / mid`` as ``|2 num - q (bid + ask)| / (q (bid + ask))``.
    ``lpx``/``lq``: scratch for the walk (LEVELS floats each)."""
    lots = lots_of(qty, step)
    n = walk_levels(bk, side, lots, step, lpx, lq)
    q = 0.0
    num = 0.0
    for j in range(n):
        q += lq[j]
        num += tick_index(lpx[j], tick) * lq[j]
    qs = q * mid_ticks2(bid, ask, tick)
    return q >= lots and abs(2.0 * num - qs) * 1e4 <= pmin(lim[L_MAX_SLIPPAGE], slip) * qs


@njit
def order_rate_ok(lim, recent_n) -> bool:
    return recent_n < lim[L_MAX_ORDERS_PER_S]


@njit
def portfolio_delta_ok(lim, worst_qty, position, mid, others_delta) -> bool:
    """The portfolio's net delta in USD, this instrument at its worst case plus the others' (each its
    position times its mid), within the limit; or the order moves it towards zero (a hedge leg)."""
    after = worst_qty * mid + others_delta
    return abs(after) <= lim[L_PF_MAX_DELTA] or abs(after) < abs(position * mid + others_delta)


@njit
def portfolio_gross_ok(lim, worst_qty, mid, others_gross) -> bool:
    """The portfolio's gross exposure in USD (the sum of every instrument's ``|position| * mid``, this
    one at its worst case) within the limit."""
    return abs(worst_qty) * mid + others_gross <= lim[L_PF_MAX_GROSS]


@njit
def portfolio_loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, mid, others_pnl) -> bool:
    """The portfolio's PnL (this instrument's ``cash + position * mid`` plus the others', each taken
    the same way) above the stop. A sum of floats over instruments, taken in instrument order: not
    exact as :func:`loss_ok` is, but the same on every run."""
    if not (abs(pos_hi) <= 2**53 and abs(cash_hi) <= 2**53):
        return False
    own = (cash_hi * _WORD + cash_lo) * 1e-12 + (pos_hi * _WORD + pos_lo) * 1e-12 * mid
    return own + others_pnl > -lim[L_PF_LOSS_STOP]


_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a float into two 26-bit halves
_WORD = 4294967296.0  # 2**32: money and position reach the rules as two words, hi * 2**32 + lo
_FAR = 2.0**900  # the exact path's operands stay within 2**-900 .. 2**900: no overflow, no underflow


@njit
def _two_sum(a, b):
    """``a + b`` and its rounding error, exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit
def _two_prod(a, b):
    """``a * b`` and its rounding error, exactly (Dekker; no FMA needed)."""
    p = a * b
    c = _SPLIT * a
    ah = c - (c - a)
    al = a - ah
    c = _SPLIT * b
    bh = c - (c - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@njit(nrt=True)
def _sum_is_positive(t) -> bool:
    """Whether the exact sum of the floats ``t`` is > 0: Shewchuk's grow-expansion turns them into
    non-overlapping components of increasing magnitude, and the largest one carries the sign."""
    e = np.zeros(t.shape[0])
    for k in range(t.shape[0]):
        q = t[k]
        for i in range(k):
            q, h = _two_sum(q, e[i])
            e[i] = h
        e[k] = q
    for i in range(t.shape[0] - 1, -1, -1):
        if e[i] != 0.0:
            return e[i] > 0.0
    return False


@njit(nrt=True)
def loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, mid) -> bool:
    """Whether the day's PnL, ``cash + position * mid``, is still above the stop (``-lim[L_LOSS_STOP]``),
    decided exactly. Position and cash are integers of 1e-12, as two words each (``hi * 2**32 + lo``,
    ``0 <= lo < 2**32``); ``mid`` is read as the float it is. Floats decide when the answer is clear of
    their rounding by far; otherwise the sum is taken exactly in units of 1e-12 USDT (error-free
    products and sums). Fails closed: a NaN, a word beyond 2**53, or, in the exact case, a mid or stop
    outside 2**-900 .. 2**900 stops."""
    stop = lim[L_LOSS_STOP]
    if not (abs(pos_hi) <= 2**53 and abs(cash_hi) <= 2**53):
        return False
    cash = (cash_hi * _WORD + cash_lo) * 1e-12
    pm = (pos_hi * _WORD + pos_lo) * 1e-12 * mid
    est = cash + pm + stop
    if not math.isfinite(est):
        return est > 0.0  # an infinite stop, or a position worth more than floats hold
    # each term is off by a few units in the 16th digit: 1e-9 of their sizes is far beyond that
    tol = 1e-9 * (abs(cash) + abs(pm) + stop)
    if est > tol:
        return True
    if est < -tol:
        return False
    if not (1.0 / _FAR <= mid <= _FAR and 1.0 / _FAR <= stop <= _FAR):
        return False
    t = np.empty(8)
    t[0] = cash_hi * _WORD
    t[1] = float(cash_lo)
    t[2], t[3] = _two_prod(pos_hi * _WORD, mid)
    t[4], t[5] = _two_prod(float(pos_lo), mid)
    t[6], t[7] = _two_prod(stop, 1e12)
    return _sum_is_positive(t)


@njit
def verdict(
    lim,
    rules,
    pos_hi,
    pos_lo,
    cash_hi,
    cash_lo,
    pos_lots,
    open_buy,
    open_sell,
    recent_n,
    kill,
    side,
    otype,
    px,
    qty,
    reduce_only,
    slip,
    source,
    age,
    has_book,
    bid,
    bid_sz,
    ask,
    ask_sz,
    bk,
    step,
    tick,
    book_ts,
    now,
    lpx,
    lq,
    others_delta,
    others_gross,
    others_pnl,
) -> int:
    """The reason code (R_OK: accepted) for a new order: the code of the first rule of ``rules`` that fails.
    ``lim``: :func:`limits_array`; ``rules``: :func:`rule_codes` (R_OK entries are skipped); position and
    cash: integers of 1e-12 as two words each (:func:`loss_ok`); ``pos_lots``, ``open_buy``, ``open_sell``:
    the position and the sizes resting orders still have open, in whole lots of ``step``; ``recent_n``:
    accepted new orders in the rate window; ``side``/``otype``/``source``: codes; ``slip``: the order's
    slippage cap, NaN for none; the book (read only when ``has_book``): its top, received at ``book_ts``, and
    for the walk of a market order ``bk``, laid out as :func:`engine.book.as_levels` does, walked in lots of
    the contract's size step ``step`` (its price tick: ``tick``); ``lpx``/``lq``: scratch for the walk;
    ``others_*``: the rest of the portfolio, every other instrument the engine trades: the sum of their net
    deltas (USD, position times mid), of their gross exposures and of their PnL (0 when there are none)."""
    # Sizes are taken in whole lots, integers, so every size rule is exact: bad_order comes first and
    # refuses any size that is not exactly the size of some lots, so ``lots`` is exact once it passed.
    lots = lots_of(qty, step)
    # Worst case: every resting order on the same side fills too. An order "reduces" only when even
    # then the position shrinks; only such an order may pass the position and loss limits.
    worst = worst_position(pos_lots, open_buy, open_sell, side, lots)
    reducing = abs(worst) < abs(pos_lots)
    # the USD rules price sizes: each the double nearest its exact decimal (as the venue's string reads)
    worst_qty = at_units(worst, step)
    position = at_units(pos_lots, step)
    mid = (bid + ask) / 2.0
    for i in range(rules.shape[0]):
        r = rules[i]
        if r == R_OK:
            continue
        if r == R_BAD_ORDER:
            ok = well_formed(side, otype, px, qty, step, tick)
        elif r == R_KILL:
            ok = kill_switch_ok(kill, reduce_only, source)
        elif r == R_STALE_ADVICE:
            ok = advice_fresh(lim, source, age)
        elif r == R_NO_BOOK:
            ok = has_book
        elif r == R_BAD_BOOK:
            ok = tradable_top(bid, bid_sz, ask, ask_sz)
        elif r == R_STALE_BOOK:
            ok = book_fresh(lim, book_ts, now)
        elif r == R_MAX_QTY:
            ok = order_qty_ok(lim, lots, step)
        elif r == R_REDUCE_ONLY:
            ok = not reduce_only or only_reduces(pos_lots, side, lots)
        elif r == R_MAX_POS:
            ok = reducing or position_ok(lim, worst, step)
        elif r == R_MAX_DELTA:
            ok = reducing or net_delta_ok(lim, worst_qty, mid)
        elif r == R_BAND:
            ok = otype != LIMIT or in_price_band(lim, px, bid, ask, tick)
        elif r == R_SLIP:
            ok = otype != MARKET or slippage_ok(lim, bk, step, tick, side, qty, slip, bid, ask, lpx, lq)
        elif r == R_RATE:
            ok = order_rate_ok(lim, recent_n)
        elif r == R_LOSS:
            ok = reducing or loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, mid)
        elif r == R_PF_DELTA:
            ok = portfolio_delta_ok(lim, worst_qty, position, mid, others_delta)
        elif r == R_PF_GROSS:
            ok = reducing or portfolio_gross_ok(lim, worst_qty, mid, others_gross)
        elif r == R_PF_LOSS:
            ok = reducing or portfolio_loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, mid, others_pnl)
        else:
            ok = False  # not a rule: nothing vouches for the order
        if not ok:
            return int(r)
    return R_OK


@njit
def verdict_packed(vi, vf, rules, bk, lpx, lq) -> int:
    """:func:`verdict` on its arguments packed as the core hands them over (``engine.risk_codes``:
    ``vi`` VI_SIZE int64, ``vf`` VF_SIZE float64, the limits first)."""
    return verdict(
        vf[:L_SIZE],
        rules,
        vi[VI_POS_HI],
        vi[VI_POS_LO],
        vi[VI_CASH_HI],
        vi[VI_CASH_LO],
        vi[VI_POS_LOTS],
        vi[VI_OPEN_BUY],
        vi[VI_OPEN_SELL],
        vi[VI_RECENT_N],
        vi[VI_KILL] != 0,
        vi[VI_SIDE],
        vi[VI_OTYPE],
        vf[VF_PX],
        vf[VF_QTY],
        vi[VI_REDUCE] != 0,
        vf[VF_SLIP],
        vi[VI_SOURCE],
        vi[VI_AGE],
        vi[VI_HAS_BOOK] != 0,
        vf[VF_BID],
        vf[VF_BID_SZ],
        vf[VF_ASK],
        vf[VF_ASK_SZ],
        bk,
        vf[VF_STEP],
        vf[VF_TICK],
        vi[VI_BOOK_TS],
        vi[VI_NOW],
        lpx,
        lq,
        vf[VF_OTHERS_DELTA],
        vf[VF_OTHERS_GROSS],
        vf[VF_OTHERS_PNL],
    )


def _entry(vi, vf, rules, bk, lpx, lq):  # ENTRY_SIGNATURE: the data pointers of verdict_packed's arrays
    return verdict_packed(
        carray(vi, (VI_SIZE,)),
        carray(vf, (VF_SIZE,)),
        carray(rules, (N_RULES,)),
        carray(bk, (WIDTH,)),
        carray(lpx, (LEVELS,)),
        carray(lq, (LEVELS,)),
    )


_compiled_entry: list = []


def entry() -> int:
    """The address of the rules' compiled entry (:func:`verdict_packed`), compiled (or loaded from its
    cache) on first use; 0 with the JIT off (``engine.risk_call`` calls the Python function then)."""
    if nb.config.DISABLE_JIT:
        return 0
    if not _compiled_entry:
        _compiled_entry.append(cfunc(ENTRY_SIGNATURE)(_entry))
    return int(_compiled_entry[0].address)


# ---------------------------------------------------------------- Python adapters

_NO_LEVELS = np.full(WIDTH, math.nan)
_STEP = ContractConfig().size_step  # the default contract's, for callers that name none
_TICK = ContractConfig().tick
_LPX = np.empty(LEVELS)  # walk scratch: compiled calls hold the GIL (no nogil): one pair serves all
_LQ = np.empty(LEVELS)
# check()'s last limits and their arrays, replaced in one store: a thread never reads half of another's
_last_limits: tuple = (None, None, None)
_WORD_MAX = 1 << 62  # words beyond int64 are clamped here; loss_ok refuses any beyond 2**53
_LOTS_MAX = 1 << 62


def units_words(units: int) -> tuple[int, int]:
    """An integer of 1e-12 (any size) as the two words the rules read: ``(hi, lo)``, ``units == hi *
    2**32 + lo``, ``0 <= lo < 2**32``; ``hi`` clamped to int64 (the loss stop refuses such a size)."""
    hi = units >> 32
    return max(-_WORD_MAX, min(_WORD_MAX, hi)), units & 0xFFFFFFFF


def size_lots(qty: float, step: float) -> int:
    """A size kept as a float that should be whole lots of ``step`` (an open size), as the nearest whole
    number of lots: the rules take sizes in lots. An unknown (NaN) size counts as the largest there is,
    so no size rule passes on it."""
    lots = np.rint(qty / step)
    return int(max(-_LOTS_MAX, min(_LOTS_MAX, lots))) if not math.isnan(lots) else _LOTS_MAX


def units_lots(units: int, step: float) -> int:
    """A size in integers of 1e-12 (:class:`RiskState` ``position_units``) in whole lots of ``step``, to
    the nearest (exact integers: the position is whole lots)."""
    num, den = grid(step)
    per_lot = int(num) * 10**12 // int(den)
    lots = (2 * units + per_lot) // (2 * per_lot)
    return max(-_LOTS_MAX, min(_LOTS_MAX, lots))  # an int64 for the compiled rules; far past any limit


def reduce_only_ok(position: float, side: str, qty: float, step: float) -> bool:
    """:func:`only_reduces` for a side named ``"buy"``/``"sell"``, position and size in base units of a
    contract whose size step is ``step``; a size that is not whole lots only reduces if its lots do."""
    lots = lots_of(float(qty), step)
    if not (lots >= 1.0 and math.isfinite(position)):
        return False
    return only_reduces(size_lots(position, step), BUY if side == "buy" else SELL, lots)


def verdict_of(
    lim: np.ndarray,
    rules: np.ndarray,
    state: RiskState,
    intent: OrderIntent,
    book: BookSnapshot | None,
    now_ns: Nanos,
    size_step: float = _STEP,
    tick: float = _TICK,
) -> int:
    """:func:`verdict` for a new (or malformed) intent; ``lim``/``rules``: :func:`limits_array` and
    :func:`rule_codes` of the limits; ``size_step``, ``tick``: the contract's."""
    otype = _TYPES.get(intent.order_type, -1) if intent.intent == "new" else -1  # other intents: malformed
    if book is None:
        has_book, bid, bid_sz, ask, ask_sz, bk, book_ts = False, 0.0, 0.0, 0.0, 0.0, _NO_LEVELS, 0
    else:
        has_book, book_ts = True, book.ts_recv
        bid, bid_sz, ask, ask_sz = book.bid_px[0], book.bid_sz[0], book.ask_px[0], book.ask_sz[0]
        # only a market order's walk reads past the top
        bk = as_levels(book) if otype == MARKET else _NO_LEVELS
    cutoff = now_ns - RATE_WINDOW_NS
    recent_n = 0
    for t in state.recent_order_ns:
        if t > cutoff:
            recent_n += 1
    slip = intent.max_slippage_bps
    pos_hi, pos_lo = units_words(state.position_units)
    cash_hi, cash_lo = units_words(state.cash_units)
    return verdict(
        lim,
        rules,
        pos_hi,
        pos_lo,
        cash_hi,
        cash_lo,
        units_lots(state.position_units, size_step),
        size_lots(state.open_buy_qty, size_step),
        size_lots(state.open_sell_qty, size_step),
        recent_n,
        state.kill_switch,
        _SIDES.get(intent.side, -1),
        otype,
        intent.px,
        intent.qty,
        intent.reduce_only,
        math.nan if slip is None else slip,
        _SOURCES.get(intent.source, -1),
        intent.advice_age_ns,
        has_book,
        bid,
        bid_sz,
        ask,
        ask_sz,
        bk,
        size_step,
        tick,
        book_ts,
        now_ns,
        _LPX,
        _LQ,
        state.others_delta_usd,
        state.others_gross_usd,
        state.others_pnl_usd,
    )


def check(
    limits: RiskLimits,
    state: RiskState,
    intent: OrderIntent,
    book: BookSnapshot | None,
    now_ns: Nanos,
    size_step: float = _STEP,
    tick: float = _TICK,
) -> tuple[bool, str]:
    """Accept or reject one intent (of a contract whose size step is ``size_step`` and tick ``tick``).
    Cancels are always allowed: they only ever reduce risk.

    RiskLimits is frozen: a check with the same limits as the one before reuses their arrays."""
    global _last_limits
    if intent.intent == "cancel":
        return True, "ok"
    lims = _last_limits
    if lims[0] is not limits:
        lims = _last_limits = (limits, limits_array(limits), rule_codes(limits))
    code = verdict_of(lims[1], lims[2], state, intent, book, now_ns, size_step, tick)
    return code == R_OK, REASONS[code]


def add_risk_args(p: argparse.ArgumentParser) -> None:
    """``--risk-rules NAME,...`` (``dualhub replay`` and ``dualhub live``)."""
    p.add_argument(
        "--risk-rules",
        default="",
        metavar="NAMES",
        help="the risk rules to run, in order, comma-separated (default: "
        + ",".join(DEFAULT_RULES)
        + "); never without "
        + ", ".join(MANDATORY_RULES),
    )


def risk_fields(args: argparse.Namespace, base: RiskLimits | None = None) -> dict[str, RiskLimits]:
    """The config field of the flag: ``{"risk": ...}`` over ``base``, or nothing when not given."""
    if not args.risk_rules:
        return {}
    return {"risk": replace(base or RiskLimits(), rules=args.risk_rules)}
