"""The risk gateway's codes, shared by the rules (``engine/risk.py``) and by the code that calls them.

The decision core (``engine/kernel/``) and the simulated venue import this module, never
``engine/risk.py``: the core calls the rules through the address of their compiled entry
(``engine/risk_call.py`` says why), so an edited rule recompiles the entry alone, not the replay loop.
What is here: the reason codes, the order codes, the indexes of the limits, the layout of the
entry's arguments, and the two size rules the strategy and the venues also apply. An edit here
recompiles everything that calls the rules.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numba import types

from engine.book import SIDE_BUY, SIDE_SELL
from engine.contract import at_units
from engine.jit import njit

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
    "portfolio_net_delta",
    "portfolio_gross",
    "portfolio_loss_stop",
)
# reason codes: indexes into REASONS
(
    R_OK,
    R_BAD_ORDER,
    R_KILL,
    R_NO_BOOK,
    R_STALE_BOOK,
    R_MAX_QTY,
    R_MAX_POS,
    R_MAX_DELTA,
    R_BAND,
    R_SLIP,
    R_RATE,
    R_LOSS,
    R_STALE_ADVICE,
    R_BAD_BOOK,
    R_REDUCE_ONLY,
    R_PF_DELTA,
    R_PF_GROSS,
    R_PF_LOSS,
) = range(len(REASONS))

# The rules: each is named by the reason it rejects with, and coded by that reason's code.
RULES: Final = REASONS[1:]
N_RULES: Final = len(RULES)

# order codes (OrderIntent's strings)
BUY, SELL = SIDE_BUY, SIDE_SELL
LIMIT, MARKET = 0, 1
SRC_QUOTE, SRC_KEV, SRC_FLATTEN, SRC_CANCEL = 0, 1, 2, 3
# each source's name (OrderIntent.source, the risk stream's source column), indexed by its code
SOURCES: Final = ("quote", "kev", "flatten", "cancel")

# RiskLimits as the float64 array the rules read (limits_array)
(
    L_MAX_POSITION,
    L_MAX_NET_DELTA,
    L_MAX_ORDER_QTY,
    L_MAX_SLIPPAGE,
    L_PRICE_BAND,
    L_MAX_ORDERS_PER_S,
    L_STALE_BOOK,
    L_LOSS_STOP,
    L_MAX_ADVICE_AGE,
    L_PF_MAX_DELTA,
    L_PF_MAX_GROSS,
    L_PF_LOSS_STOP,
) = range(12)
L_SIZE = 12
RATE_WINDOW_NS = 1_000_000_000  # order_rate counts accepted new orders in (now - this, now]

# The entry's arguments (engine.risk.verdict's, packed): int64 and float64 values in these places, then
# the rule codes (N_RULES int64), the book (60 float64, engine.book.as_levels' layout) and the scratch
# of a market order's walk (two of LEVELS float64).
(
    VI_POS_HI,  # position and cash, integers of 1e-12 as two words each (hi * 2**32 + lo)
    VI_POS_LO,
    VI_CASH_HI,
    VI_CASH_LO,
    VI_POS_LOTS,  # the position, and what resting orders have open by side, in whole lots
    VI_OPEN_BUY,
    VI_OPEN_SELL,
    VI_RECENT_N,  # accepted new orders in the rate window
    VI_KILL,  # 0/1
    VI_SIDE,
    VI_OTYPE,
    VI_REDUCE,  # 0/1
    VI_SOURCE,
    VI_AGE,
    VI_HAS_BOOK,  # 0/1
    VI_BOOK_TS,
    VI_NOW,
) = range(17)
VI_SIZE = 17
# the floats: the limits first (L_* places), then these
(
    VF_PX,
    VF_QTY,
    VF_SLIP,  # the order's own slippage cap; NaN: none
    VF_BID,
    VF_BID_SZ,
    VF_ASK,
    VF_ASK_SZ,
    VF_STEP,
    VF_TICK,
    VF_OTHERS_DELTA,
    VF_OTHERS_GROSS,
    VF_OTHERS_PNL,
) = range(L_SIZE, L_SIZE + 12)
VF_SIZE = L_SIZE + 12
_i64p, _f64p = types.CPointer(types.int64), types.CPointer(types.float64)
# reason code (ints, floats, rules, book, walk prices, walk sizes)
ENTRY_SIGNATURE = types.int64(_i64p, _f64p, _i64p, _f64p, _f64p, _f64p)


@njit
def lots_within(limit, step) -> float:
    """The most whole lots of ``step`` a size limit allows: those whose size reads as at most the limit
    (``at_units(n, step) <= limit``: the limit rounded down, the safe side). A limit of 0.003 is 3 lots
    of 0.001 (3 / 1000 reads as 0.003 although 0.003 / 0.001 is 2.9999999999999996), one of
    0.0199999999999 is 19, not 20; inf stays inf, NaN stays NaN (the comparison then refuses)."""
    n = np.floor(limit / step + 1e-9)
    if not (0.0 <= n < 2.0**52):
        return n if not n > 0.0 else math.inf  # NaN, negative, or past what lots can count
    while n > 0.0 and at_units(n, step) > limit:
        n -= 1.0
    while at_units(n + 1.0, step) <= limit:
        n += 1.0
    return n


@njit
def only_reduces(position, side, lots) -> bool:
    """Whether a reduce-only order of ``lots`` can only shrink ``position`` (lots too): opposite side,
    no bigger than it. The gateway asks it of the engine's position, the venues (simulated and local
    exchange) of theirs."""
    signed = lots if side == BUY else -lots
    return position * signed < 0 and lots <= abs(position)
