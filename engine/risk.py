"""Risk gateway: deterministic pre-trade rules between every order intent and the exchange.

Each rule is a small compiled function below and :func:`verdict` runs them in a fixed order: the first
failing rule names the rejection (an index into :data:`REASONS`). Its inputs are plain numbers and
arrays, so the replay kernel calls it on its own state, and the Python engine through :func:`check`,
the pure ``(limits, state, intent, book, now_ns) -> (accepted, reason)`` adapter (or
:func:`verdict_of` with arrays it keeps); the caller turns the verdict into a ``RiskDecision`` event,
so every decision is on the record. A rule holds when its comparison does (``value <= limit``) and
the verdict rejects on ``not rule``, so a NaN anywhere rejects instead of passing. With
``NUMBA_DISABLE_JIT=1`` the rules run as plain Python: the readable reference of the compiled code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from engine.book import LEVELS, SIDE_BUY, SIDE_SELL, WIDTH, as_levels, tradable_top, walk_levels, walked_avg
from engine.events import BookSnapshot, Nanos
from engine.exact import pmin
from engine.jit import njit

REASONS: Final = (
    "ok",
    "bad_order",
    "kill_switch",
    "no_book",
    "stale_book",
    "max_order_qty",
    "max_position",
    "max_net_delta",
    "price_band",
    "max_slippage",
    "order_rate",
    "loss_stop",
    "stale_advice",
    "bad_book",
    "reduce_only",
)
# reason codes: indexes into REASONS
(
    R_OK,
    R_BAD_ORDER,
    R_KILL,
    R_NO_BOOK,
    R_STALE_BOOK,
    R_MAX_QTY,
    R_MAX_POS,
    R_MAX_DELTA,
    R_BAND,
    R_SLIP,
    R_RATE,
    R_LOSS,
    R_STALE_ADVICE,
    R_BAD_BOOK,
    R_REDUCE_ONLY,
) = range(len(REASONS))
R_LOSS_UNDECIDED = -1  # an estimated PnL within its tolerance of the loss stop (never with an exact one)

# order codes (OrderIntent's strings)
BUY, SELL = SIDE_BUY, SIDE_SELL
LIMIT, MARKET = 0, 1
SRC_QUOTE, SRC_KEV, SRC_FLATTEN, SRC_CANCEL = 0, 1, 2, 3
_SIDES: Final = {"buy": BUY, "sell": SELL}
_TYPES: Final = {"limit": LIMIT, "market": MARKET}
_SOURCES: Final = {"quote": SRC_QUOTE, "kev": SRC_KEV, "flatten": SRC_FLATTEN, "cancel": SRC_CANCEL}

# RiskLimits as the float64 array the rules read (limits_array)
(
    L_MAX_POSITION,
    L_MAX_NET_DELTA,
    L_MAX_ORDER_QTY,
    L_MAX_SLIPPAGE,
    L_PRICE_BAND,
    L_MAX_ORDERS_PER_S,
    L_STALE_BOOK,
    L_LOSS_STOP,
    L_MAX_ADVICE_AGE,
) = range(9)
L_SIZE = 9
RATE_WINDOW_NS = 1_000_000_000  # order_rate counts accepted new orders in (now - this, now]


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

    def __post_init__(self) -> None:
        # `not (x > 0)` also refuses NaN, which would switch a rule off (every comparison is false).
        for name in (
            "max_position",
            "max_net_delta_usd",
            "max_order_qty",
            "max_slippage_bps",
            "price_band_bps",
            "daily_loss_stop_usd",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskState:
    """The slice of portfolio state the rules read."""

    position: float = 0.0
    open_buy_qty: float = 0.0
    open_sell_qty: float = 0.0
    pnl_usd: float = 0.0  # realised + unrealised, net of fees, since the start of the day
    recent_order_ns: tuple[Nanos, ...] = ()  # send times of accepted new orders
    kill_switch: bool = False


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
    return a


# ---------------------------------------------------------------- the rules (True: the order passes)


@njit
def well_formed(side, otype, px, qty) -> bool:
    """A known side and type, a finite positive size, and for a limit order a finite positive price."""
    if not ((side == BUY or side == SELL) and (otype == LIMIT or otype == MARKET)):
        return False
    if not (qty > 0 and math.isfinite(qty)):
        return False
    return otype != LIMIT or (px > 0 and math.isfinite(px))


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
def order_qty_ok(lim, qty) -> bool:
    return qty <= lim[L_MAX_ORDER_QTY] + 1e-12


@njit
def only_reduces(position, side, qty) -> bool:
    """Whether a reduce-only order can only shrink ``position``: opposite side, no bigger than it. The
    gateway asks it of the engine's position, the venues (simulated and local exchange) of theirs."""
    signed = qty if side == BUY else -qty
    return position * signed < 0 and qty <= abs(position) + 1e-12


@njit
def worst_position(position, open_buy, open_sell, side, qty) -> float:
    """The position if every resting order on the order's side fills too."""
    signed = qty if side == BUY else -qty
    open_same = open_buy if side == BUY else -open_sell
    return position + open_same + signed


@njit
def position_ok(lim, worst) -> bool:
    return abs(worst) <= lim[L_MAX_POSITION] + 1e-12


@njit
def net_delta_ok(lim, worst, mid) -> bool:
    return abs(worst) * mid <= lim[L_MAX_NET_DELTA]


@njit
def in_price_band(lim, px, mid) -> bool:
    return abs(px - mid) / mid * 1e4 <= lim[L_PRICE_BAND]


@njit
def slippage_ok(lim, bk, side, qty, slip, mid, lpx, lq) -> bool:
    """The displayed depth fills all of a market order, at an average price within the gateway's
    slippage limit or the order's own (``slip``; NaN: none) if tighter. ``lpx``/``lq``: scratch for the
    walk (LEVELS floats each)."""
    filled, avg = walked_avg(lpx, lq, walk_levels(bk, side, qty, lpx, lq))
    return filled >= qty - 1e-12 and abs(avg - mid) / mid * 1e4 <= pmin(lim[L_MAX_SLIPPAGE], slip)


@njit
def order_rate_ok(lim, recent_n) -> bool:
    return recent_n < lim[L_MAX_ORDERS_PER_S]


@njit
def loss_stop(lim, pnl, pnl_tol) -> int:
    """R_LOSS once the day's PnL is down to the stop. ``pnl_tol``: how far an estimated ``pnl`` may be
    off; within it of the stop the answer is R_LOSS_UNDECIDED (0 for an exact PnL: never)."""
    stop = -lim[L_LOSS_STOP]
    if pnl > stop + pnl_tol:
        return R_OK
    if pnl < stop - pnl_tol or pnl_tol == 0.0:
        return R_LOSS
    return R_LOSS_UNDECIDED


@njit
def verdict(
    lim,
    position,
    open_buy,
    open_sell,
    pnl,
    pnl_tol,
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
    book_ts,
    now,
    lpx,
    lq,
) -> int:
    """The reason code (R_OK: accepted) for a new order. ``lim``: :func:`limits_array`; ``recent_n``:
    accepted new orders in the rate window; ``side``/``otype``/``source``: codes; ``slip``: the order's
    slippage cap, NaN for none; the book (read only when ``has_book``): its top, received at
    ``book_ts``, and for the walk of a market order ``bk``, laid out as :func:`engine.book.as_levels`
    does; ``lpx``/``lq``: scratch for the walk."""
    if not well_formed(side, otype, px, qty):
        return R_BAD_ORDER
    if not kill_switch_ok(kill, reduce_only, source):
        return R_KILL
    if not advice_fresh(lim, source, age):
        return R_STALE_ADVICE
    if not has_book:
        return R_NO_BOOK
    if not tradable_top(bid, bid_sz, ask, ask_sz):
        return R_BAD_BOOK
    if not book_fresh(lim, book_ts, now):
        return R_STALE_BOOK
    if not order_qty_ok(lim, qty):
        return R_MAX_QTY
    if reduce_only and not only_reduces(position, side, qty):
        return R_REDUCE_ONLY
    # Worst case: every resting order on the same side fills too. An order "reduces" only when even
    # then the position shrinks; only such an order may pass the position and loss limits.
    worst = worst_position(position, open_buy, open_sell, side, qty)
    reducing = abs(worst) < abs(position) - 1e-12
    mid = (bid + ask) / 2.0
    if not reducing:
        if not position_ok(lim, worst):
            return R_MAX_POS
        if not net_delta_ok(lim, worst, mid):
            return R_MAX_DELTA
    if otype == LIMIT:
        if not in_price_band(lim, px, mid):
            return R_BAND
    elif not slippage_ok(lim, bk, side, qty, slip, mid, lpx, lq):
        return R_SLIP
    if not order_rate_ok(lim, recent_n):
        return R_RATE
    return R_OK if reducing else loss_stop(lim, pnl, pnl_tol)


# ---------------------------------------------------------------- Python adapters

_NO_LEVELS = np.full(WIDTH, math.nan)
_LPX = np.empty(LEVELS)  # walk scratch: compiled calls hold the GIL (no nogil): one pair serves all
_LQ = np.empty(LEVELS)
# check()'s last limits and their array, replaced in one store: a thread never reads half of another's
_last_limits: tuple = (None, None)


def reduce_only_ok(position: float, side: str, qty: float) -> bool:
    """:func:`only_reduces` for a side named ``"buy"``/``"sell"``."""
    return only_reduces(float(position), BUY if side == "buy" else SELL, float(qty))


def verdict_of(
    lim: np.ndarray, state: RiskState, intent: OrderIntent, book: BookSnapshot | None, now_ns: Nanos
) -> int:
    """:func:`verdict` for a new (or malformed) intent; ``lim``: :func:`limits_array` of the limits."""
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
    return verdict(
        lim,
        state.position,
        state.open_buy_qty,
        state.open_sell_qty,
        state.pnl_usd,
        0.0,
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
        book_ts,
        now_ns,
        _LPX,
        _LQ,
    )


def check(
    limits: RiskLimits, state: RiskState, intent: OrderIntent, book: BookSnapshot | None, now_ns: Nanos
) -> tuple[bool, str]:
    """Accept or reject one intent. Cancels are always allowed: they only ever reduce risk.

    RiskLimits is frozen: a check with the same limits as the one before reuses their array."""
    global _last_limits
    if intent.intent == "cancel":
        return True, "ok"
    lims = _last_limits
    if lims[0] is not limits:
        lims = _last_limits = (limits, limits_array(limits))
    code = verdict_of(lims[1], state, intent, book, now_ns)
    return code == R_OK, REASONS[code]
