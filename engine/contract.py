"""Contract configuration (tick, size step, fees), as Bitget's /api/v2/mix/market/contracts gives it,
and its price and size rounding, compiled once for the engine, the strategy and the replay kernel."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from engine.exact import pyround
from engine.jit import njit

round_exact = pyround  # CPython's round(x, nd): one implementation, in engine/exact.py


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
