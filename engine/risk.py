"""Risk gateway: deterministic pre-trade rules between every order intent and the exchange.

:func:`check` is pure: ``(limits, state, intent, book, now_ns) -> (accepted, reason)``. The caller
turns the verdict into a ``RiskDecision`` event, so every decision is on the record. Rules run in a
fixed order and the first failing rule names the rejection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from engine.book import avg_price, tradable, walk_book
from engine.events import BookSnapshot, Nanos

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


def reduce_only_ok(position: float, side: str, qty: float) -> bool:
    """Whether a reduce-only order can only shrink ``position``: opposite side, no bigger than it. The
    gateway asks it of the engine's position, the venues (simulated and local exchange) of theirs."""
    signed = qty if side == "buy" else -qty
    return position * signed < 0 and qty <= abs(position) + 1e-12


def check(
    limits: RiskLimits, state: RiskState, intent: OrderIntent, book: BookSnapshot | None, now_ns: Nanos
) -> tuple[bool, str]:
    """Accept or reject one intent. Cancels are always allowed: they only ever reduce risk.

    Every limit is written ``not (value <= limit)``, so a NaN anywhere rejects instead of passing."""
    if intent.intent == "cancel":
        return True, "ok"
    side, qty, order_type = intent.side, intent.qty, intent.order_type
    if (
        intent.intent != "new"
        or side not in ("buy", "sell")
        or order_type not in ("limit", "market")
        or not (qty > 0 and math.isfinite(qty))
        or (order_type == "limit" and not (intent.px > 0 and math.isfinite(intent.px)))
    ):
        return False, "bad_order"
    # The kill switch stops everything but orders that can only close the position (reduce-only
    # flattening, checked below like any order).
    if state.kill_switch and not (intent.reduce_only and intent.source == "flatten"):
        return False, "kill_switch"
    if intent.source == "kev" and not (intent.advice_age_ns <= limits.max_advice_age_ns):
        return False, "stale_advice"
    if book is None:
        return False, "no_book"
    if not tradable(book):
        return False, "bad_book"
    if not (now_ns - book.ts_recv <= limits.stale_book_ns):
        return False, "stale_book"
    if not (qty <= limits.max_order_qty + 1e-12):
        return False, "max_order_qty"
    position = state.position
    if intent.reduce_only and not reduce_only_ok(position, side, qty):
        return False, "reduce_only"
    signed = qty if side == "buy" else -qty
    # Worst case: every resting order on the same side fills too. An order "reduces" only when even
    # then the position shrinks; only such an order may pass the position and loss limits.
    open_same = state.open_buy_qty if side == "buy" else -state.open_sell_qty
    worst = position + open_same + signed
    reducing = abs(worst) < abs(position) - 1e-12
    mid = (book.bid_px[0] + book.ask_px[0]) / 2.0
    if not reducing:
        if not (abs(worst) <= limits.max_position + 1e-12):
            return False, "max_position"
        if not (abs(worst) * mid <= limits.max_net_delta_usd):
            return False, "max_net_delta"
    if order_type == "limit":
        if not (abs(intent.px - mid) / mid * 1e4 <= limits.price_band_bps):
            return False, "price_band"
    else:
        levels = walk_book(book, side, qty)
        filled = sum(q for _, q in levels)
        max_bps = limits.max_slippage_bps
        if intent.max_slippage_bps is not None:
            max_bps = min(max_bps, intent.max_slippage_bps)
        if not (filled >= qty - 1e-12 and abs(avg_price(levels) - mid) / mid * 1e4 <= max_bps):
            return False, "max_slippage"
    window_start = now_ns - 1_000_000_000
    if len([t for t in state.recent_order_ns if t > window_start]) >= limits.max_orders_per_s:
        return False, "order_rate"
    if not (state.pnl_usd > -limits.daily_loss_stop_usd) and not reducing:
        return False, "loss_stop"
    return True, "ok"
