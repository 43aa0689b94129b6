"""A strategy written as a plain Python function: quote around the microprice.

Run it with ``dualhub replay SESSION --strategy docs/examples/microprice.py:quote`` (or ``dualhub live``);
docs/STRATEGY.md explains the signature. The microprice weighs each side of the touch by the size on
the other side, so it sits nearer the side about to be taken; the quotes keep ``half_spread_ticks``
either side of it, shifted against the inventory away from Kev's target. Prices are whole ticks and
sizes whole lots, as the engine counts them.
"""

import math

from engine.book import ASK_PX, ASK_SZ, BID_PX, BID_SZ, tradable_top
from engine.contract import tick_index
from engine.strategies import Param

PARAMS = (
    Param("half_spread_ticks", 1.5, 0.5, 1e6, "distance of each quote from the microprice"),
    Param("inventory_skew_ticks", 4.0, -1e6, 1e6, "shift per max_position of (position - target)"),
)


def quote(book, tick, qty, label, position, target, max_position, params):
    bid_sz, ask_sz = book[BID_SZ], book[ASK_SZ]
    if not tradable_top(book[BID_PX], bid_sz, book[ASK_PX], ask_sz):  # NaN, one-sided, crossed
        return 0, 0, 0, 0
    bid, ask = int(tick_index(book[BID_PX], tick)), int(tick_index(book[ASK_PX], tick))  # in ticks
    micro = (bid * ask_sz + ask * bid_sz) / (bid_sz + ask_sz)
    inventory = (position - target) / max_position if max_position > 0 else 0.0
    fair = micro - inventory * params[1]
    bid_t = min(math.floor(fair - params[0]), ask - 1)  # never at or through the other side's touch
    ask_t = max(math.ceil(fair + params[0]), bid + 1)
    bid_lots = qty if position + qty <= max_position else 0  # a fill stays within the limit
    ask_lots = qty if position - qty >= -max_position else 0
    return bid_lots, bid_t, ask_lots, ask_t
