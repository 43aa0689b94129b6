"""The baseline strategy: quote around the touch, lean with Laya's label and Kev's target."""

from __future__ import annotations

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
    position: int,
    target: float,
    max_position: int,
    quote_qty: int,
    offset_ticks: float,
    label_skew_ticks: float,
    inventory_skew_ticks: float,
) -> tuple[int, int, int, int]:
    """(bid lots, bid ticks, ask lots, ask ticks) around the top of book ``bid``/``ask``; a side's lots
    are 0 where no quote is wanted. ``position``, ``quote_qty``, ``max_position``: whole lots;
    ``target``: lots.

    A quote sits ``offset_ticks`` behind the touch, shifted towards the label's side and against the
    inventory away from Kev's ``target`` (in ``max_position`` units), never crossing the touch; a side
    whose fill would take the position past ``max_position`` stays empty. None at all on a top that is
    not tradable (NaN, infinite, one-sided, crossed: quoting around nothing), nor past ``2**52`` ticks,
    where a price is no longer a multiple of the tick."""
    if not (tradable_top(bid, bid_sz, ask, ask_sz) and ask < MAX_TICKS * tick):
        return 0, 0, 0, 0
    inv = (position - target) / max_position if max_position > 0 else 0.0
    shift = label_signal(label) * label_skew_ticks - inv * inventory_skew_ticks
    want_buy, want_sell = room_for(position, quote_qty, max_position)
    bid_t = ticks_from(bid, shift - offset_ticks, ask, tick, True) if want_buy else 0
    ask_t = ticks_from(ask, shift + offset_ticks, bid, tick, False) if want_sell else 0
    return (quote_qty if want_buy else 0), bid_t, (quote_qty if want_sell else 0), ask_t


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
