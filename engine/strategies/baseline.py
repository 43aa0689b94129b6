"""The baseline strategy: quote around the touch, lean with Laya's label and Kev's target."""

from __future__ import annotations

import math

from engine.book import ASK_PX, ASK_SZ, BID_PX, BID_SZ, tradable_top
from engine.contract import room_for, ticks_from
from engine.events import Label
from engine.jit import njit
from engine.strategies import Param

NAME = "baseline"
PARAMS = (
    Param("offset_ticks", 1.0, 0.0, 1e6, "distance behind the touch when neutral"),
    Param("label_skew_ticks", 2.0, -1e6, 1e6, "quotes shift towards the label's side by this much"),
    Param("inventory_skew_ticks", 4.0, -1e6, 1e6, "shift per max_position of (position - target)"),
)

NAN = math.nan
MAX_TICKS = 4503599627370496.0  # 2**52
_LEAN_BUY, _LEAN_SELL = int(Label.LEAN_BUY), int(Label.LEAN_SELL)


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
    offset_ticks: float,
    label_skew_ticks: float,
    inventory_skew_ticks: float,
) -> tuple[bool, float, bool, float]:
    """(want a bid, its price, want an ask, its price) around the top of book ``bid``/``ask``; a price
    is NaN where no quote is wanted.

    A quote sits ``offset_ticks`` behind the touch, shifted towards the label's side and against the
    inventory away from Kev's ``target`` (in ``max_position`` units), never crossing the touch; a side
    whose fill would take the position past ``max_position`` stays empty. None at all on a top that is
    not tradable (NaN, infinite, one-sided, crossed: quoting around nothing), nor past ``2**52`` ticks,
    where a price is no longer a multiple of the tick."""
    if not (tradable_top(bid, bid_sz, ask, ask_sz) and ask < MAX_TICKS * tick):
        return False, NAN, False, NAN
    inv = (position - target) / max_position if max_position > 0 else 0.0
    shift = label_signal(label) * label_skew_ticks - inv * inventory_skew_ticks
    want_buy, want_sell = room_for(position, quote_qty, max_position)
    bid_px = ticks_from(bid, shift - offset_ticks, ask, tick, True) if want_buy else NAN
    ask_px = ticks_from(ask, shift + offset_ticks, bid, tick, False) if want_sell else NAN
    return want_buy, bid_px, want_sell, ask_px


@njit
def quote(book, tick, qty, label, position, target, max_position, params):
    """The strategy signature (:mod:`engine.strategies`) over :func:`quote_prices`: it reads the top."""
    return quote_prices(
        book[BID_PX],
        book[BID_SZ],
        book[ASK_PX],
        book[ASK_SZ],
        tick,
        label,
        position,
        target,
        max_position,
        qty,
        params[0],
        params[1],
        params[2],
    )
