"""A strategy written as a plain Python function: quote around the microprice.

Run it with ``dualhub replay SESSION --strategy docs/examples/microprice.py:quote`` (or ``dualhub live``);
docs/STRATEGY.md explains the signature. The microprice weighs each side of the touch by the size on
the other side, so it sits nearer the side about to be taken; the quotes keep ``half_spread_ticks``
either side of it, shifted against the inventory away from Kev's target.
"""

import math

from engine.book import ASK_PX, ASK_SZ, BID_PX, BID_SZ, tradable_top
from engine.contract import room_for, round_to_tick
from engine.strategies import Param

PARAMS = (
    Param("half_spread_ticks", 1.5, 0.5, 1e6, "distance of each quote from the microprice"),
    Param("inventory_skew_ticks", 4.0, -1e6, 1e6, "shift per max_position of (position - target)"),
)


def quote(book, tick, qty, label, position, target, max_position, params):
    bid, bid_sz, ask, ask_sz = book[BID_PX], book[BID_SZ], book[ASK_PX], book[ASK_SZ]
    if not tradable_top(bid, bid_sz, ask, ask_sz):  # NaN, one-sided, crossed: nothing to quote around
        return False, math.nan, False, math.nan
    micro = (bid * ask_sz + ask * bid_sz) / (bid_sz + ask_sz)
    inventory = (position - target) / max_position if max_position > 0 else 0.0
    fair = micro - inventory * params[1] * tick
    bid_px = round_to_tick(min(fair - params[0] * tick, ask - tick), tick)  # never crossing the touch
    ask_px = round_to_tick(max(fair + params[0] * tick, bid + tick), tick)
    want_buy, want_sell = room_for(position, qty, max_position)  # a fill stays within the limit
    return want_buy, bid_px, want_sell, ask_px
