"""Baseline strategy: quote around mid, lean with Laya's label and Kev's target.

The rules (quote prices, Kev's target clamp, the market order towards it) are compiled functions over
scalars, called by the replay kernel as they are and by the Python engine through the adapters here."""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.book import SIDE_BUY, SIDE_SELL, tradable_top
from engine.contract import ContractConfig, round_to_step, round_to_tick
from engine.events import BookSnapshot, Label, Nanos
from engine.exact import pmax, pmin
from engine.fastinit import frozen_maker
from engine.jit import njit

NAN = math.nan
_MAX_TICKS = 4503599627370496.0  # 2**52
BUY, SELL, NO_ORDER = SIDE_BUY, SIDE_SELL, -1
LABEL_CODE = {x.name: int(x) for x in Label}  # the label's class index, as the replay kernel keeps it
_LEAN_BUY, _LEAN_SELL = int(Label.LEAN_BUY), int(Label.LEAN_SELL)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuoteConfig:
    quote_qty: float = 0.002
    offset_ticks: int = 1  # distance behind the touch when neutral
    label_skew_ticks: int = 2  # quotes shift towards the label's side by this much
    inventory_skew_ticks: float = 4.0  # shift per max_position of (position - target)
    emergency_hold_ns: Nanos = 2_000_000_000  # quotes stay pulled this long after EMERGENCY
    requote_min_ns: Nanos = 250_000_000
    rebalance_min_ns: Nanos = 1_000_000_000  # min spacing of market orders towards Kev's target


@dataclass(frozen=True, slots=True)
class Quote:
    side: str
    px: float
    qty: float


@njit
def label_signal(label: int) -> int:
    """Which way a label leans the quotes: +1 LEAN_BUY, -1 LEAN_SELL, 0 otherwise (any other code)."""
    return 1 if label == _LEAN_BUY else (-1 if label == _LEAN_SELL else 0)


@njit
def quote_prices(
    bid: float,
    bid_sz: float,
    ask: float,
    ask_sz: float,
    tick: float,
    label: int,
    position: float,
    target: float,
    max_position: float,
    quote_qty: float,
    offset_ticks: int,
    label_skew_ticks: int,
    inventory_skew_ticks: float,
) -> tuple[bool, float, bool, float]:
    """(want a bid, its price, want an ask, its price) around the top of book ``bid``/``ask``; a price
    is NaN where no quote is wanted.

    A quote sits ``offset_ticks`` behind the touch, shifted towards the label's side and against the
    inventory away from Kev's ``target`` (in ``max_position`` units), never crossing the touch; a side
    whose fill would take the position past ``max_position`` stays empty. None at all on a top that is
    not tradable (NaN, infinite, one-sided, crossed: quoting around nothing), nor past ``2**52`` ticks,
    where a price is no longer a multiple of the tick."""
    if not (tradable_top(bid, bid_sz, ask, ask_sz) and ask < _MAX_TICKS * tick):
        return False, NAN, False, NAN
    inv = (position - target) / max_position if max_position > 0 else 0.0
    shift = label_signal(label) * label_skew_ticks - inv * inventory_skew_ticks
    want_buy = position + quote_qty <= max_position + 1e-12
    want_sell = position - quote_qty >= -max_position - 1e-12
    bid_px = round_to_tick(pmin(bid + (shift - offset_ticks) * tick, ask - tick), tick) if want_buy else NAN
    ask_px = round_to_tick(pmax(ask + (shift + offset_ticks) * tick, bid + tick), tick) if want_sell else NAN
    return want_buy, bid_px, want_sell, ask_px


@njit
def kev_target(
    has_command: bool, now: int, valid_until: int, flatten: bool, target: float, m: float
) -> float:
    """Kev's target while its advice is fresh, within +-``m`` (max_position); flat without advice, once
    it expired or when it says flatten (a market maker's neutral)."""
    if not has_command or now > valid_until or flatten:
        return 0.0
    return pmax(-m, pmin(m, target))


@njit
def rebalance_order(
    target: float, position: float, quote_qty: float, max_order_qty: float, size_step: float, min_qty: float
) -> tuple[int, float]:
    """(side, qty) of the market order towards ``target``: the gap, at most ``max_order_qty``, down to
    the size step; ``NO_ORDER`` while the gap is under one quote or rounds below ``min_qty``."""
    diff = target - position
    if abs(diff) < quote_qty - 1e-12:
        return NO_ORDER, 0.0
    qty = round_to_step(pmin(abs(diff), max_order_qty), size_step)
    if qty < min_qty:
        return NO_ORDER, 0.0
    return (BUY if diff > 0 else SELL), qty


def desired_quotes(
    cfg: QuoteConfig,
    contract: ContractConfig,
    book: BookSnapshot,
    *,
    label: str,
    position: float,
    target: float,
    max_position: float,
) -> list[Quote]:
    """:func:`quote_prices` on ``book``'s top: the bid and ask we want resting now, buy first."""
    buy, bid_px, sell, ask_px = quote_prices(
        book.bid_px[0],
        book.bid_sz[0],
        book.ask_px[0],
        book.ask_sz[0],
        contract.tick,
        LABEL_CODE.get(label, -1),
        position,
        target,
        max_position,
        cfg.quote_qty,
        cfg.offset_ticks,
        cfg.label_skew_ticks,
        cfg.inventory_skew_ticks,
    )
    out = []
    if buy:
        out.append(_quote("buy", bid_px, cfg.quote_qty))
    if sell:
        out.append(_quote("sell", ask_px, cfg.quote_qty))
    return out


_quote = frozen_maker(Quote)  # Quote(side, px, qty) without the frozen __init__ (two per requote)
