"""The risk gateway's settings and inputs: which rules run (:data:`DEFAULT_RULES`, :func:`checked_rules`),
their limits (:class:`RiskLimits`, and :func:`limits_array`, the array the rules read), the order a strategy
wants (:class:`OrderIntent`) and the state the rules judge it on (:class:`RiskState`).

The rules themselves are in ``engine/risk.py``, which re-exports every name here; the codes they share
with the decision core are in ``engine/risk_codes.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from engine.errors import DualhubError
from engine.events import Nanos
from engine.risk_codes import (
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
    N_RULES,
    REASONS,
    RULES,
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
