"""Contract configuration (tick, size step, fees), as Bitget's /api/v2/mix/market/contracts gives it."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True, slots=True, kw_only=True)
class ContractConfig:
    symbol: str = "BTCUSDT"
    tick: float = 0.1
    size_step: float = 0.001
    min_qty: float = 0.001
    maker_fee_rate: Decimal = Decimal("0.0002")
    taker_fee_rate: Decimal = Decimal("0.0006")

    def round_px(self, px: float) -> float:
        return round(round(px / self.tick) * self.tick, 10)

    def round_qty(self, qty: float) -> float:
        return round(int(qty / self.size_step + 1e-9) * self.size_step, 10)
