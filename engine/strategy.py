"""Baseline strategy: quote around mid, lean with Laya's label and Kev's target. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from engine.book import tradable
from engine.contract import ContractConfig
from engine.events import BookSnapshot, Nanos
from engine.fastinit import frozen_maker

SIGNAL = {"HOLD": 0, "LEAN_BUY": 1, "LEAN_SELL": -1, "EMERGENCY": 0}


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
    """The bid and ask we want resting now (possibly none on a side that would breach the limit).

    None at all on a book that is not :func:`~engine.book.tradable`: quoting around a NaN, infinite,
    one-sided or crossed top is quoting around nothing (the engine then pulls what rests)."""
    tick = contract.tick
    # Past 2**52 ticks a price is no longer a multiple of the tick (and round() of it may overflow).
    if not tradable(book) or not book.ask_px[0] < _MAX_TICKS * tick:
        return []
    inv = (position - target) / max_position if max_position > 0 else 0.0
    shift = SIGNAL.get(label, 0) * cfg.label_skew_ticks - inv * cfg.inventory_skew_ticks
    best_bid, best_ask = book.bid_px[0], book.ask_px[0]
    bid = min(best_bid + (shift - cfg.offset_ticks) * tick, best_ask - tick)
    ask = max(best_ask + (shift + cfg.offset_ticks) * tick, best_bid + tick)
    out = []
    if position + cfg.quote_qty <= max_position + 1e-12:
        out.append(_quote("buy", _round_px(contract, bid), cfg.quote_qty))
    if position - cfg.quote_qty >= -max_position - 1e-12:
        out.append(_quote("sell", _round_px(contract, ask), cfg.quote_qty))
    return out


_MAX_TICKS = 2.0**52
_ROUNDED: dict[tuple[float, float], float] = {}


def _round_px(contract: ContractConfig, px: float) -> float:
    """``contract.round_px(px)``, remembered by (tick, px), all it depends on: quotes sit near a slowly
    moving touch, so the same prices come back all the time, and ``round(x, 10)`` is slow. Bounded."""
    if type(contract) is not ContractConfig or px == 0.0:  # a subclass may round differently; -0.0 == 0.0
        return contract.round_px(px)
    key = (contract.tick, px)
    v = _ROUNDED.get(key)
    if v is None:
        if len(_ROUNDED) >= 65_536:
            _ROUNDED.clear()
        v = _ROUNDED[key] = contract.round_px(px)
    return v


_quote = frozen_maker(Quote)  # Quote(side, px, qty) without the frozen __init__ (two per requote)
