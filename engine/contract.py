"""Contract configuration (tick, size step, fees), as Bitget's /api/v2/mix/market/contracts gives it,
and its price and size rounding, compiled once for the engine, the strategy and the replay kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from engine.exact import POW10, pyround
from engine.jit import njit

_SPLIT = 134217729.0  # 2**27 + 1 (Dekker)
_TWO53 = 9007199254740992.0


@njit
def round_exact(x: float, nd: int) -> float:
    """CPython's ``round(x, nd)`` for every float and ``0 <= nd <= 22``: :func:`~engine.exact.pyround`,
    and exactly where it gives up (``|x| * 10**nd >= 2**52``). There the product is an integer give or
    take its rounding error ``lo`` (|lo| <= 1/2), so only a tie (|lo| == 1/2) moves it, to the even
    neighbour; from ``2**53`` on the decimal grid is finer than the doubles around ``x``, whose
    rounding is then ``x`` itself. A Python float also read as plain Python (``float()`` is free
    compiled): numpy scalars are not JSON numbers."""
    r = pyround(x, nd)
    if r == r or x != x:
        return float(r)
    p = POW10[nd]
    ax = abs(x)
    hi = ax * p
    if hi > _TWO53:
        return float(x)
    c = _SPLIT * ax
    ah = c - (c - ax)
    al = ax - ah
    c = _SPLIT * p
    bh = c - (c - p)
    bl = p - bh
    lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl
    if hi == _TWO53 and lo >= 0:
        return float(x)
    n = hi + 2.0 * lo if abs(lo) == 0.5 and hi - 2.0 * math.floor(hi / 2.0) != 0.0 else hi
    res = n / p
    return float(-res if x < 0 else res)


@njit
def round_to_tick(px: float, tick: float) -> float:
    """``round(round(px / tick) * tick, 10)``; a NaN or infinite ``px`` comes back as it is. ``+ 0.0``:
    Python's ``round()`` returns an int, which has no -0."""
    return round_exact((np.rint(px / tick) + 0.0) * tick, 10)


@njit
def round_to_step(qty: float, step: float) -> float:
    """``round(int(qty / step + 1e-9) * step, 10)``: down to the size step, forgiving float noise just
    under a step; a NaN or infinite ``qty`` comes back as it is."""
    return round_exact((np.trunc(qty / step + 1e-9) + 0.0) * step, 10)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContractConfig:
    symbol: str = "BTCUSDT"
    tick: float = 0.1
    size_step: float = 0.001
    min_qty: float = 0.001
    maker_fee_rate: Decimal = Decimal("0.0002")
    taker_fee_rate: Decimal = Decimal("0.0006")

    def round_px(self, px: float) -> float:
        return round_to_tick(px, self.tick)

    def round_qty(self, qty: float) -> float:
        return round_to_step(qty, self.size_step)
