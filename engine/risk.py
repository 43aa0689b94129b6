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

The gateway's settings and inputs (``RiskLimits``, ``OrderIntent``, ``RiskState``, the rule lists) are in
``engine/risk_limits.py`` and read as this module's too; the command-line flags that fill them are in
``engine/risk_args.py``.

To add a rule: a compiled function here, a reason in ``REASONS`` (its code and name, in
``engine/risk_codes.py``), a branch in :func:`verdict`, and, if it should run by default, a place in
:data:`DEFAULT_RULES` (``engine/risk_limits.py``).
"""

from __future__ import annotations

import math
from typing import Final

import numba as nb
import numpy as np
from numba import carray

from engine.book import LEVELS, WIDTH, as_levels, tradable_top, walk_levels
from engine.contract import ContractConfig, at_units, grid, lots_of, on_tick_grid
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
    SOURCES,
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
from engine.risk_exact import band_ok, net_towards_zero_ok, pnl_above, slip_ok, usd_within
from engine.risk_limits import (  # noqa: F401 - the gateway's settings and inputs, read as engine.risk's too
    BOOK_RULES,
    DEFAULT_RULES,
    MANDATORY_RULES,
    OrderIntent,
    RiskLimits,
    RiskState,
    checked_rules,
    limits_array,
    rule_codes,
)

_SIDES: Final = {"buy": BUY, "sell": SELL}
_TYPES: Final = {"limit": LIMIT, "market": MARKET}
_SOURCES: Final = {name: code for code, name in enumerate(SOURCES)}


# ---------------------------------------------------------------- the rules (True: the order passes)


@njit
def well_formed(side, otype, source, px, qty, step, tick) -> bool:
    """A known side, type and source; a size of whole lots of the contract's size step ``step`` (exactly
    the double :func:`engine.contract.at_units` gives for them, as a decimal string of it parses: the
    exchange refuses any other size); for a limit order a price of whole ticks of ``tick``, likewise
    (:func:`engine.contract.on_tick_grid`): the core holds it as that many ticks."""
    if not ((side == BUY or side == SELL) and (otype == LIMIT or otype == MARKET)):
        return False
    if not (source == SRC_QUOTE or source == SRC_KEV or source == SRC_FLATTEN):
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
    """An order acting on Kev's advice needs an age for it (-1 is "no advice": refused) within the
    limit."""
    return source != SRC_KEV or 0 <= age <= lim[L_MAX_ADVICE_AGE]


@njit
def book_fresh(lim, book_ts, now) -> bool:
    """A book received at ``book_ts``, no later than ``now``, at most the limit before it. A book with
    no valid time (negative, the NaT of INT64_MIN, or from the future) is stale; the age is taken only
    once ``0 <= book_ts <= now``, so it cannot overflow."""
    return 0 <= book_ts <= now and now - book_ts <= lim[L_STALE_BOOK]


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
def reduces(position, open_buy, open_sell, side, lots) -> bool:
    """The order, with every resting order on its side, can only shrink the position, never take it
    through zero: what "reducing" means to the exemptions and to reduce-only. An order that would flip
    the position is, in the gateway's eyes, a reducing part and an opening part, and the opening part
    passes every rule as a new order: so it is not reducing."""
    open_same = open_buy if side == BUY else -open_sell
    return only_reduces(position + open_same, side, lots)


@njit
def position_ok(lim, worst, step) -> bool:
    return abs(worst) <= lots_within(lim[L_MAX_POSITION], step)


@njit
def net_delta_ok(lim, worst, step, bid, ask) -> bool:
    """The worst case's notional, ``|worst| * size * mid``, within the limit (exactly: a position
    between two whole lots counts as the larger)."""
    num, den = grid(step)
    return usd_within(lim[L_MAX_NET_DELTA], np.ceil(abs(worst)), num, den, bid, ask, 0.0)


@njit
def in_price_band(lim, px, bid, ask) -> bool:
    """The limit price ``px`` within the band around the true mid of the book's touch: ``|px - mid| /
    mid`` in bps, as ``|2 px - (bid + ask)| / (bid + ask)``, every price read as its decimal, so the
    edge is exact (engine.risk_exact). NaN unless every price is positive and finite."""
    if not (0.0 < px < math.inf and 0.0 < bid < math.inf and 0.0 < ask < math.inf):
        return False
    return band_ok(lim[L_PRICE_BAND], px, bid, ask)


@njit
def slippage_ok(lim, bk, step, side, qty, slip, bid, ask, lpx, lq) -> bool:
    """The displayed depth fills all of a market order (in whole lots of the size step ``step``, as
    the simulated venue fills it), at an average price within the gateway's slippage limit or the
    order's own (``slip``; NaN: none) if tighter, from the true mid, exactly (engine.risk_exact).
    ``lpx``/``lq``: scratch for the walk (LEVELS floats each)."""
    if not (0.0 < bid < math.inf and 0.0 < ask < math.inf):
        return False
    lots = lots_of(qty, step)
    n = walk_levels(bk, side, lots, step, lpx, lq)
    q = 0.0
    for j in range(n):
        q += lq[j]
    return q >= lots and slip_ok(pmin(lim[L_MAX_SLIPPAGE], slip), lpx, lq, n, q, bid, ask)


@njit
def order_rate_ok(lim, recent_n) -> bool:
    """This order and those already in the window within the rate (a fractional rate allows its floor)."""
    return recent_n + 1 <= lim[L_MAX_ORDERS_PER_S]


@njit
def portfolio_delta_ok(lim, worst, position, step, bid, ask, others_delta) -> bool:
    """The portfolio's net delta in USD, this instrument at its worst case plus the others' (each its
    position times its mid), within the limit; or the order moves it towards zero (a hedge leg). A
    position between two whole lots (an adapter's) must pass at both."""
    num, den = grid(step)
    lo = np.floor(position)
    if lo == position:
        return net_towards_zero_ok(lim[L_PF_MAX_DELTA], worst, position, num, den, bid, ask, others_delta)
    hi = lo + 1.0
    return net_towards_zero_ok(
        lim[L_PF_MAX_DELTA], worst - position + lo, lo, num, den, bid, ask, others_delta
    ) and net_towards_zero_ok(
        lim[L_PF_MAX_DELTA], worst - position + hi, hi, num, den, bid, ask, others_delta
    )


@njit
def portfolio_gross_ok(lim, worst, step, bid, ask, others_gross) -> bool:
    """The portfolio's gross exposure in USD (the sum of every instrument's ``|position| * mid``, this
    one at its worst case) within the limit; the others' must be a number >= 0."""
    if not others_gross >= 0.0:
        return False
    num, den = grid(step)
    return usd_within(lim[L_PF_MAX_GROSS], np.ceil(abs(worst)), num, den, bid, ask, others_gross)


@njit
def loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, mid) -> bool:
    """Whether the day's PnL, ``cash + position * mid``, is still above the stop (``-lim[L_LOSS_STOP]``),
    decided exactly (:func:`engine.risk_exact.pnl_above`, at a touch of ``mid`` on both sides)."""
    return pnl_above(lim[L_LOSS_STOP], pos_hi, pos_lo, cash_hi, cash_lo, mid, mid, 0.0)


@njit
def portfolio_loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, bid, ask, others_pnl) -> bool:
    """The portfolio's PnL (this instrument's ``cash + position * mid`` plus the others') above the
    stop, decided exactly on the others' sum as given."""
    return pnl_above(lim[L_PF_LOSS_STOP], pos_hi, pos_lo, cash_hi, cash_lo, bid, ask, others_pnl)


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
    # ``pos_lots`` is whole in the core; an adapter hands a position between two whole lots as their
    # midpoint, which every comparison with whole lots answers as it would any value between them.
    lots = lots_of(qty, step)
    # Worst case: every resting order on the same side fills too. An order "reduces" only when even
    # then the position shrinks without crossing zero; only such an order is exempt from the position
    # and loss limits, and only such an order is reduce-only.
    worst = worst_position(pos_lots, open_buy, open_sell, side, lots)
    reducing = reduces(pos_lots, open_buy, open_sell, side, lots)
    # Unwinding: the order alone shrinks the position held without taking it through zero. The
    # portfolio rules never refuse it: each resting order was judged when it was sent, and counting
    # them here would keep an unwind (a hedge's leg closing, a flatten) waiting on quotes (reducing
    # implies unwinding: resting orders on the order's side only move it further).
    unwinding = only_reduces(pos_lots, side, lots)
    for i in range(rules.shape[0]):
        r = rules[i]
        if r == R_OK:
            continue
        if r == R_BAD_ORDER:
            ok = well_formed(side, otype, source, px, qty, step, tick)
        elif r == R_KILL:
            ok = kill_switch_ok(kill, reduce_only, source)
        elif r == R_STALE_ADVICE:
            ok = advice_fresh(lim, source, age)
        elif r == R_NO_BOOK:
            ok = has_book
        elif r == R_BAD_BOOK:
            # the walk reads WIDTH values: a shorter book is no book to price an order on
            ok = bk.shape[0] == WIDTH and tradable_top(bid, bid_sz, ask, ask_sz)
        elif r == R_STALE_BOOK:
            ok = book_fresh(lim, book_ts, now)
        elif r == R_MAX_QTY:
            ok = order_qty_ok(lim, lots, step)
        elif r == R_REDUCE_ONLY:
            ok = not reduce_only or reducing
        elif r == R_MAX_POS:
            ok = reducing or position_ok(lim, worst, step)
        elif r == R_MAX_DELTA:
            ok = reducing or net_delta_ok(lim, worst, step, bid, ask)
        elif r == R_BAND:
            ok = otype != LIMIT or in_price_band(lim, px, bid, ask)
        elif r == R_SLIP:
            ok = otype != MARKET or slippage_ok(lim, bk, step, side, qty, slip, bid, ask, lpx, lq)
        elif r == R_RATE:
            ok = order_rate_ok(lim, recent_n)
        elif r == R_LOSS:
            ok = reducing or pnl_above(lim[L_LOSS_STOP], pos_hi, pos_lo, cash_hi, cash_lo, bid, ask, 0.0)
        elif r == R_PF_DELTA:
            # an unwinding leg is never refused by a portfolio rule: that would keep the risk it sheds
            ok = unwinding or portfolio_delta_ok(lim, worst, pos_lots, step, bid, ask, others_delta)
        elif r == R_PF_GROSS:
            ok = unwinding or portfolio_gross_ok(lim, worst, step, bid, ask, others_gross)
        elif r == R_PF_LOSS:
            ok = unwinding or portfolio_loss_ok(lim, pos_hi, pos_lo, cash_hi, cash_lo, bid, ask, others_pnl)
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
    """A size kept as a float that should be whole lots of ``step`` (a venue's position), as the nearest
    whole number of lots. An unknown (NaN) size counts as the largest there is."""
    lots = np.rint(qty / step)
    return int(max(-_LOTS_MAX, min(_LOTS_MAX, lots))) if not math.isnan(lots) else _LOTS_MAX


def open_lots(qty: float, step: float) -> int:
    """What resting orders have open, a float that should be whole lots of ``step``, as whole lots
    rounded up (an exposure: the safe side): the fewest lots whose size reads as at least ``qty``. An
    unknown, negative or infinite size counts as the largest there is, so no size rule passes on it."""
    try:
        q = float(qty)
    except (TypeError, ValueError, OverflowError):
        return _LOTS_MAX
    if q == 0.0:
        return 0
    if not 0.0 < q < math.inf:
        return _LOTS_MAX
    n = max(1.0, np.ceil(q / step - 1e-9))
    if not n < 2.0**52:
        return _LOTS_MAX
    while n > 1.0 and at_units(n - 1.0, step) >= q:
        n -= 1.0
    while at_units(n, step) < q:
        n += 1.0
    return int(n)


def units_lots(units: int, step: float) -> float:
    """A position in integers of 1e-12 (:class:`RiskState` ``position_units``) in lots of ``step``,
    exactly: whole when it is whole lots (as the core's always is); between two whole numbers of lots,
    their midpoint, which each size rule (comparisons with whole lots) answers as it would any value
    between them, so neither end is assumed. Clamped to +-2**62 lots, far past any limit."""
    num, den = grid(step)
    per_lot = int(num) * 10**12 // int(den)
    lots, rest = divmod(int(units), per_lot)
    lots = max(-_LOTS_MAX, min(_LOTS_MAX, lots))
    return float(lots) + (0.5 if rest else 0.0)


def reduce_only_ok(position: float, side: str, qty: float, step: float) -> bool:
    """:func:`only_reduces` for a side named ``"buy"``/``"sell"``, position and size in base units of a
    contract whose size step is ``step``; a size that is not whole lots only reduces if its lots do."""
    lots = lots_of(float(qty), step)
    if not (lots >= 1.0 and math.isfinite(position)):
        return False
    return only_reduces(size_lots(position, step), BUY if side == "buy" else SELL, lots)


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _ns(v: object, bad: int) -> int:
    """A time or an age as the int64 the rules read; ``bad`` for one that is no integer or is outside
    int64 (``bad`` is chosen by the caller so that its rule refuses)."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        return bad
    v = int(v)
    return v if _I64_MIN <= v <= _I64_MAX else bad


def _real(v: object) -> float:
    """A number as the float the rules read; NaN (every rule refuses on it) for anything else."""
    if isinstance(v, bool):
        return math.nan
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return math.nan


_EMPTY = np.empty(0)


def _book_args(book: BookSnapshot, otype: int) -> tuple[float, float, float, float, np.ndarray]:
    """The touch and the levels of ``book``; a book that is not LEVELS deep on each of its four sides
    (or holds what is not a number) gives NaNs and no levels, which bad_book refuses."""
    sides = (book.bid_px, book.bid_sz, book.ask_px, book.ask_sz)
    try:
        if any(len(x) != LEVELS for x in sides):
            return math.nan, math.nan, math.nan, math.nan, _EMPTY
        # only a market order's walk reads past the top
        bk = as_levels(book) if otype == MARKET else _NO_LEVELS
        return _real(sides[0][0]), _real(sides[1][0]), _real(sides[2][0]), _real(sides[3][0]), bk
    except (TypeError, ValueError, OverflowError):
        return math.nan, math.nan, math.nan, math.nan, _EMPTY


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
    :func:`rule_codes` of the limits; ``size_step``, ``tick``: the contract's. Values the compiled
    rules cannot hold (times past int64, sizes that are not numbers) are turned into ones their rule
    refuses, never raised."""
    new = intent.intent == "new" and isinstance(intent.order_type, str)
    otype = _TYPES.get(intent.order_type, -1) if new else -1  # other intents: malformed
    now = _ns(now_ns, _I64_MIN)  # no valid clock: every book is then stale
    if book is None:
        has_book, bid, bid_sz, ask, ask_sz, bk, book_ts = False, 0.0, 0.0, 0.0, 0.0, _NO_LEVELS, 0
    else:
        has_book, book_ts = True, _ns(book.ts_recv, _I64_MIN)
        bid, bid_sz, ask, ask_sz, bk = _book_args(book, otype)
    recent_n = 0
    if now != _I64_MIN:
        cutoff = now - RATE_WINDOW_NS
        for t in state.recent_order_ns:
            if t > cutoff:
                recent_n += 1
    else:
        recent_n = _LOTS_MAX  # no clock to count a window by: the rate rule refuses
    slip = intent.max_slippage_bps
    pos_hi, pos_lo = units_words(int(state.position_units))
    cash_hi, cash_lo = units_words(int(state.cash_units))
    age = _ns(intent.advice_age_ns, _I64_MAX)  # an age past int64 is as old as there is
    return verdict(
        lim,
        rules,
        pos_hi,
        pos_lo,
        cash_hi,
        cash_lo,
        units_lots(state.position_units, size_step),
        float(open_lots(state.open_buy_qty, size_step)),
        float(open_lots(state.open_sell_qty, size_step)),
        recent_n,
        bool(state.kill_switch),
        _SIDES.get(intent.side, -1) if isinstance(intent.side, str) else -1,
        otype,
        _real(intent.px),
        _real(intent.qty),
        bool(intent.reduce_only),
        math.nan if slip is None else _real(slip),
        _SOURCES.get(intent.source, -1) if isinstance(intent.source, str) else -1,
        age,
        has_book,
        bid,
        bid_sz,
        ask,
        ask_sz,
        bk,
        size_step,
        tick,
        book_ts,
        now,
        _LPX,
        _LQ,
        _real(state.others_delta_usd),
        _real(state.others_gross_usd),
        _real(state.others_pnl_usd),
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
