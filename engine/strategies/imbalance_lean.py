"""A worked example (docs/STRATEGY.md): quotes lean with the depth imbalance of the top levels.

When the displayed bids outweigh the asks, buyers are waiting: both quotes move up by up to
``lean_ticks`` (and down when the asks outweigh the bids). Laya's label is not read; Kev's target
still pulls the quotes against the inventory, as the baseline's do."""

from __future__ import annotations

import math

from engine.book import ASK_PX, ASK_SZ, BID_PX, BID_SZ, tradable_top
from engine.contract import room_for, ticks_from
from engine.jit import njit
from engine.strategies import Param

NAME = "imbalance_lean"
PARAMS = (
    Param("offset_ticks", 1.0, 0.0, 1e6, "distance behind the touch on a balanced book"),
    Param("lean_ticks", 3.0, -1e6, 1e6, "shift at full imbalance (all depth on one side)"),
    Param("depth_levels", 5.0, 1.0, 15.0, "levels per side the imbalance is measured over (whole)"),
    Param("inventory_skew_ticks", 4.0, -1e6, 1e6, "shift per max_position of (position - target)"),
)

MAX_TICKS = 4503599627370496.0  # 2**52: past it a price is no longer a multiple of the tick


@njit
def quote(book, tick, qty, label, position, target, max_position, params):
    offset, lean, depth, inv_skew = params[0], params[1], int(params[2]), params[3]
    bid, ask = book[BID_PX], book[ASK_PX]
    if not (tradable_top(bid, book[BID_SZ], ask, book[ASK_SZ]) and ask < MAX_TICKS * tick):
        return 0, 0, 0, 0
    bids = 0.0
    asks = 0.0
    for i in range(depth):
        b = book[BID_SZ + i]
        a = book[ASK_SZ + i]
        if 0.0 <= b < math.inf:  # a missing level is NaN: it counts nothing
            bids += b
        if 0.0 <= a < math.inf:
            asks += a
    imbalance = (bids - asks) / (bids + asks)  # in [-1, 1]: the top's sizes are > 0
    inv = (position - target) / max_position if max_position > 0 else 0.0
    shift = imbalance * lean - inv * inv_skew
    want_buy, want_sell = room_for(position, qty, max_position)
    bid_t = ticks_from(bid, shift - offset, ask, tick, True) if want_buy else 0
    ask_t = ticks_from(ask, shift + offset, bid, tick, False) if want_sell else 0
    return (qty if want_buy else 0), bid_t, (qty if want_sell else 0), ask_t
