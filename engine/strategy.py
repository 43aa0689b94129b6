"""What the engine does with a strategy: its quote config, Kev's target, the market order towards it.

The rules are compiled functions over scalars and arrays, called by the core (``engine/kernel/``)
as they are. This module imports no strategy (the core's cache would then depend on them:
``engine/strategies/call.py``); the adapter that runs the configured strategy on a BookSnapshot is
``engine/strategies/quoter.py``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.book import SIDE_BUY, SIDE_SELL
from engine.contract import ContractConfig, at_units, whole_lots
from engine.events import Label, Nanos
from engine.exact import pmax, pmin
from engine.jit import njit
from engine.risk_codes import lots_within

BUY, SELL, NO_ORDER = SIDE_BUY, SIDE_SELL, -1
LABEL_CODE = {x.name: int(x) for x in Label}  # the label's class index, as the replay kernel keeps it


@dataclass(frozen=True, slots=True, kw_only=True)
class QuoteConfig:
    quote_qty: float = 0.002
    # the baseline strategy's parameters (engine/strategies/baseline.py), here so that configs and
    # recorded runs that set them keep meaning the same; a strategy parameter overrides them
    offset_ticks: int = 1  # distance behind the touch when neutral
    label_skew_ticks: int = 2  # quotes shift towards the label's side by this much
    inventory_skew_ticks: float = 4.0  # shift per max_position of (position - target)
    emergency_hold_ns: Nanos = 2_000_000_000  # quotes stay pulled this long after EMERGENCY
    requote_min_ns: Nanos = 250_000_000
    rebalance_min_ns: Nanos = 1_000_000_000  # min spacing of market orders towards Kev's target


@dataclass(frozen=True, slots=True)
class Quote:
    side: str
    px: float
    qty: float


@njit
def kev_target(
    has_command: bool, now: int, valid_until: int, flatten: bool, target: float, m: float
) -> float:
    """Kev's target while its advice is fresh, within +-``m`` (max_position); flat without advice, once
    it expired or when it says flatten (a market maker's neutral)."""
    if not has_command or now > valid_until or flatten:
        return 0.0
    return pmax(-m, pmin(m, target))


@njit
def rebalance_order(
    target: float, pos_lots: float, quote_qty: float, max_order_qty: float, size_step: float, min_qty: float
) -> tuple[int, float]:
    """(side, qty) of the market order from a position of ``pos_lots`` whole lots of ``size_step``
    towards ``target`` (base units): the gap's whole lots, at most those ``max_order_qty`` allows;
    ``NO_ORDER`` while the gap is under one quote or its whole lots under ``min_qty`` (or NaN).

    Counted in lots: the gap in base units, a difference of two large doubles, carries their rounding
    (100788.958 - 100780.964 is not 7.994), which no fixed tolerance absorbs at every size; in lots
    the noise is a billionth of a lot, forgiven as engine.contract.lots_of forgives it."""
    gap = target / size_step - pos_lots
    if not abs(gap) + 1e-9 >= quote_qty / size_step:
        return NO_ORDER, 0.0
    lots = pmin(np.floor(abs(gap) + 1e-9), lots_within(max_order_qty, size_step))
    if not (lots > 0 and lots + 1e-9 >= min_qty / size_step):
        return NO_ORDER, 0.0
    return (BUY if gap > 0 else SELL), at_units(lots, size_step)


def quote_lots(cfg: QuoteConfig, contract: ContractConfig) -> int:
    """The quote size in whole lots of the contract's size step, or one error line for a size between
    two (every order of it would be refused)."""
    sym = contract.symbol
    hint = f": give the instrument its own (--instrument {sym}:quote_qty=Q)"
    return whole_lots(cfg.quote_qty, contract.size_step, f"{sym}: quote_qty", hint)
