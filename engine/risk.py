"""Risk gateway: deterministic pre-trade rules between every order intent and the exchange.

:func:`check` is pure: ``(limits, state, intent, book, now_ns) -> (accepted, reason)``. The caller
turns the verdict into a ``RiskDecision`` event, so every decision is on the record. Rules run in a
fixed order and the first failing rule names the rejection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from engine.book import avg_price, walk_book
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
        for name in ("max_position", "max_net_delta_usd", "max_order_qty", "max_slippage_bps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RiskLimits.{name} must be > 0")
        if self.max_orders_per_s <= 0 or self.stale_book_ns <= 0:
            raise ValueError("RiskLimits.max_orders_per_s and stale_book_ns must be > 0")


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


def _reduces(position: float, side: str, qty: float) -> bool:
    signed = qty if side == "buy" else -qty
    return position != 0 and abs(position + signed) < abs(position) + 1e-12 and position * signed < 0


def check(
    limits: RiskLimits, state: RiskState, intent: OrderIntent, book: BookSnapshot | None, now_ns: Nanos
) -> tuple[bool, str]:
    """Accept or reject one intent. Cancels are always allowed: they only ever reduce risk."""
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
    if state.kill_switch:
        return False, "kill_switch"
    if intent.source == "kev" and intent.advice_age_ns > limits.max_advice_age_ns:
        return False, "stale_advice"
    if book is None:
        return False, "no_book"
    if now_ns - book.ts_recv > limits.stale_book_ns:
        return False, "stale_book"
    if qty > limits.max_order_qty + 1e-12:
        return False, "max_order_qty"
    position = state.position
    reducing = intent.reduce_only or _reduces(position, side, qty)
    signed = qty if side == "buy" else -qty
    # Worst case: every resting order on the same side fills too.
    open_same = state.open_buy_qty if side == "buy" else -state.open_sell_qty
    worst = position + open_same + signed
    mid = book.mid
    if not reducing:
        if abs(worst) > limits.max_position + 1e-12:
            return False, "max_position"
        if abs(worst) * mid > limits.max_net_delta_usd:
            return False, "max_net_delta"
    if order_type == "limit":
        if abs(intent.px - mid) / mid * 1e4 > limits.price_band_bps:
            return False, "price_band"
    else:
        levels = walk_book(book, side, qty)
        filled = sum(q for _, q in levels)
        max_bps = limits.max_slippage_bps
        if intent.max_slippage_bps is not None:
            max_bps = min(max_bps, intent.max_slippage_bps)
        if filled < qty - 1e-12 or abs(avg_price(levels) - mid) / mid * 1e4 > max_bps:
            return False, "max_slippage"
    window_start = now_ns - 1_000_000_000
    if len([t for t in state.recent_order_ns if t > window_start]) >= limits.max_orders_per_s:
        return False, "order_rate"
    if state.pnl_usd <= -limits.daily_loss_stop_usd and not reducing:
        return False, "loss_stop"
    return True, "ok"
