"""The market simulator's contracts (``venue/simulator.py``): the simulated instruments
(:data:`INSTRUMENTS`), a contract's integer units and exchange strings, the model rescaled onto another
contract, and trade rows as Bitget writes them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final

from venue.sim_model import LOTS_PER_UNIT, TICKS_PER_PX, SimConfig

# ---------------------------------------------------------------- contracts and wire


@dataclass(frozen=True, slots=True, kw_only=True)
class Instrument:
    """A simulated contract: tick and size step as exchange strings, and its typical price level."""

    tick: str
    size_step: str
    price: float


# Tick and size step of Bitget's USDT-M perpetuals. BTCUSDT: pricePlace 1 (docs/bitget-v2.md) and the
# engine's default contract; ETHUSDT and SOLUSDT: 2 and 3 price decimals, DOGEUSDT 6 and whole coins
# (volumePlace 0), as Bitget's product list in ../shared/data/real/bitget-v1/BITGET.0 gives them.
# BTCUSDT's price is SimConfig's initial_mid_px, so a BTCUSDT leader runs the single-symbol model
# unchanged.
INSTRUMENTS: Final[Mapping[str, Instrument]] = MappingProxyType(
    {
        "BTCUSDT": Instrument(tick="0.1", size_step="0.001", price=90_000.0),
        "ETHUSDT": Instrument(tick="0.01", size_step="0.01", price=3_000.0),
        "SOLUSDT": Instrument(tick="0.001", size_step="0.1", price=150.0),
        "DOGEUSDT": Instrument(tick="0.000001", size_step="1", price=0.2),
    }
)
_SYMBOL_RE: Final = re.compile(r"^[A-Z0-9]{2,40}$")
# SimConfig fields in ticks that describe price *moves* (scaled with the price level, so moves keep
# their size in bps) and in lots (scaled so a lot keeps its notional); spreads, gaps and hysteresis
# stay in ticks: they are set by the tick, whatever the price.
_MOVE_FIELDS: Final = (
    "fair_vol_ticks_per_sqrt_s",
    "signal_drift_ticks_per_s",
    "trade_impact_ticks",
    "level_impact_ticks",
    "liquidation_median_ticks",
)
_LOT_FIELDS: Final = ("trade_median_lots", "level_median_lots", "trade_max_lots")


def _decimals(text: str) -> tuple[int, int]:
    """``"0.01"`` -> (2, 1): the step is ``unit`` in units of 10**-dp."""
    d = Decimal(text).normalize()
    if not d.is_finite() or d <= 0:
        raise ValueError(f"a tick or size step must be a positive decimal, got {text!r}")
    dp = max(0, -int(d.as_tuple().exponent))
    return dp, int(d.scaleb(dp))


def _formatter(text: str) -> Callable[[int], str]:
    """Integer steps -> the exchange string (``"90000.1"``, ``"0.250"``): every decimal of the step."""
    dp, unit = _decimals(text)
    if dp == 0:
        return lambda n: str(n * unit)
    p = 10**dp

    def fmt(n: int) -> str:
        v = n * unit
        return f"{v // p}.{v % p:0{dp}d}"

    return fmt


class _Units:
    """One contract's integer model units: prices in ticks, sizes in lots."""

    __slots__ = ("ticks_per_px", "lots_per_unit", "px", "sz")

    def __init__(self, tick: str, size_step: str) -> None:
        pdp, punit = _decimals(tick)
        sdp, sunit = _decimals(size_step)
        self.ticks_per_px = 10**pdp / punit
        self.lots_per_unit = 10**sdp / sunit
        self.px = _formatter(tick)
        self.sz = _formatter(size_step)


_DEFAULT_UNITS: Final = _Units("0.1", "0.001")  # SimConfig's: TICKS_PER_PX, LOTS_PER_UNIT


def _instrument_config(cfg: SimConfig, inst: Instrument, units: _Units) -> SimConfig:
    """``cfg`` describes a contract of tick 0.1 and size step 0.001 at ``initial_mid_px``; the same
    market on ``inst``: moves keep their size in bps, a lot its notional."""
    move = inst.price * units.ticks_per_px / (cfg.initial_mid_px * TICKS_PER_PX)
    lot = (cfg.initial_mid_px / LOTS_PER_UNIT) / (inst.price / units.lots_per_unit)
    if move == 1.0 and lot == 1.0:
        return cfg
    changes: dict[str, Any] = {"initial_mid_px": inst.price}
    for name in _MOVE_FIELDS:
        v = getattr(cfg, name)
        changes[name] = tuple(x * move for x in v) if isinstance(v, tuple) else v * move
    for name in _LOT_FIELDS:
        v = getattr(cfg, name)
        changes[name] = max(1, round(v * lot)) if isinstance(v, int) else v * lot
    return replace(cfg, **changes)


def _trade_rows(fills: list[tuple[int, int, int, bool, int]], units: _Units) -> list[dict[str, str]]:
    """Bitget order: newest first."""
    px, sz = units.px, units.sz
    return [
        {"ts": str(ms), "price": px(t), "size": sz(q), "side": "buy" if b else "sell", "tradeId": str(i)}
        for ms, t, q, b, i in reversed(fills)
    ]
