"""Contract configuration (tick, size step, fees), as Bitget's /api/v2/mix/market/contracts gives it,
and its price and size rounding, compiled once for the engine, the strategy and the replay kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from engine.errors import DualhubError
from engine.exact import POW10, pyround
from engine.jit import njit

round_exact = pyround  # CPython's round(x, nd): one implementation, in engine/exact.py

_EXACT = 9007199254740992.0  # 2**53: integers up to here are exact doubles


@njit(inline="always")
def grid(unit: float) -> tuple[float, float]:
    """A tick or size step as the exact fraction ``num / den`` of its shortest decimal, ``den`` a power
    of ten up to 10**12: ``(num, den)``, both integers held as doubles; ``(unit, 1.0)`` for a unit of
    more than 12 decimals (no such contract exists)."""
    for d in range(13):
        v = unit * POW10[d]
        n = np.rint(v)
        if n >= 1.0 and abs(v - n) <= n * 1e-13:
            return n, POW10[d]
    return unit, 1.0


@njit(inline="always")
def at_units(k: float, unit: float) -> float:
    """The price (or size) of ``k`` ticks (or steps) of ``unit``: the double nearest the exact decimal
    ``k * unit``, which is what the exchange's string for it parses to. ``k * num`` is an exact integer
    and one division by ``den`` rounds once, correctly, so no decimal rounding is emulated. Past 2**53
    (num x k) the product ``k * unit`` is the answer: no double is finer there than the grid."""
    num, den = grid(unit)
    v = k * num
    # float(): read as plain Python (NUMBA_DISABLE_JIT) these are numpy floats, not JSON numbers
    if not abs(v) <= _EXACT:
        return float(k * unit)
    return float(v / den)


@njit(inline="always")
def lots_of(q: float, step: float) -> float:
    """The whole lots of ``step`` in the size ``q`` (a displayed, traded or ordered size), down,
    forgiving float noise just under a lot (1e-9 of one: 0.003 / 0.001 is 2.9999999999999996); 0 for a
    size that is not a finite positive number. An integer, held as a double (exact below 2**53): the
    simulated venue fills and keeps positions in these."""
    if not 0.0 < q < math.inf:
        return 0.0
    return np.floor(q / step + 1e-9)


@njit(inline="always")
def room_for(position: int, qty: int, limit: int) -> tuple[bool, bool]:
    """(a buy of ``qty`` lots keeps ``position`` lots within +-``limit`` lots, a sell of it does):
    whole lots, so the comparison is exact at every size (as doubles, 100780.964 + 7.994 is
    100788.95800000001, past a limit of 100788.958)."""
    return position + qty <= limit, position - qty >= -limit


def decimal_parts(d: Decimal) -> tuple[int, int] | None:
    """``d`` as (integer, decimals) with d == integer * 10**-decimals, decimals in 0..12; None for
    more decimals (or no number)."""
    sign, digits, exp = d.as_tuple()
    if not isinstance(exp, int) or exp < -12:
        return None
    n = int("".join(map(str, digits)) or "0")
    n = -n if sign else n
    return (n * 10**exp, 0) if exp > 0 else (n, -exp)


def unit_parts(unit: float, what: str) -> tuple[int, int]:
    """A tick or size step as the :func:`decimal_parts` of its shortest decimal (as :func:`grid`
    reads it): the core counts prices and sizes in integers of it. One error line for a unit that is
    not a positive decimal of at most 12 decimals."""
    ok = math.isfinite(unit) and unit > 0
    parts = decimal_parts(Decimal(repr(unit)).normalize()) if ok else None
    if parts is None:
        raise DualhubError(f"{what} {unit!r} is not a positive decimal of at most 12 decimals")
    return parts


def step_parts(step: float) -> tuple[int, int]:
    """A size step as ``(num, decimals)``: the core counts sizes in whole lots of it
    (engine.kernel.size_of)."""
    return unit_parts(step, "size step")


def tick_parts(tick: float) -> tuple[int, int]:
    """A tick as ``(num, decimals)``: the core holds order prices in whole ticks of it
    (engine.kernel.price_of) and reads a fill price as an integer of 10**-decimals (``_px_units``)."""
    return unit_parts(tick, "tick")


def whole_lots(qty: float, step: float, what: str, hint: str = "") -> int:
    """``qty`` as a whole number (>= 1) of lots of ``step``, exactly as the decimals they stand for;
    one error line (``what``, then ``hint``) for a size between two lots (the exchange would refuse
    every order of it)."""
    lots = _decimal_lots(qty, step) if math.isfinite(qty) else Decimal(0)
    if lots < 1 or lots != lots.to_integral_value():
        raise DualhubError(f"{what} {qty!r} is not a whole number of size steps ({step!r}){hint}")
    return int(lots)


def lots_below(qty: float, step: float) -> int:
    """The whole lots of ``step`` in a limit ``qty`` (down; 2**62 for no limit, an infinite one)."""
    if not qty < 2.0**62 * step:
        return 1 << 62
    return max(0, int(_decimal_lots(qty, step) // 1))


def _decimal_lots(qty: float, step: float) -> Decimal:
    """``qty / step`` as the decimals the two doubles stand for divide (a finite ``qty``)."""
    num, dec = step_parts(step)
    return Decimal(repr(qty)) * 10**dec / num


NO_PX = -(1 << 62)  # the price of an order that has none (a market order), in ticks


@njit(inline="always")
def tick_index(px: float, tick: float) -> float:
    """``px`` in whole ticks, to the nearest (half-even): an integer held as a double, exact below
    2**53; NaN and infinities stay as they are, so a comparison with them reads as it does in prices.
    The core keeps order prices in ticks (engine.kernel.OI_PX) and the venue matches them against
    book and trade prices through this, so an equal price is an equal integer, not a tolerance."""
    return np.rint(px / tick) + 0.0


@njit
def on_tick_grid(px: float, tick: float) -> bool:
    """``px`` is a positive whole number of ticks below 2**52, exactly the double :func:`at_units`
    gives for them (as a decimal string of it parses): the only prices the exchange takes."""
    k = tick_index(px, tick)
    return 1.0 <= k < 2.0**52 and at_units(k, tick) == px


@njit
def round_to_tick(px: float, tick: float) -> float:
    """``px`` to the nearest tick (half-even), as :func:`at_units` gives that tick; a NaN or infinite
    ``px`` comes back as it is. ``+ 0.0``: a price has no -0."""
    if not math.isfinite(px):
        return float(px)
    return at_units(tick_index(px, tick), tick)


@njit
def ticks_from(px: float, ticks: float, other: float, tick: float, buy: bool) -> int:
    """The price ``ticks`` ticks (any real number, rounded half-even to a whole tick) from ``px``, a buy's
    at least a tick below ``other``, a sell's at least a tick above, in whole ticks: a strategy's quote
    around the touch that never crosses or locks its other side. Counted in ticks, integers, not as
    ``px + ticks * tick`` (whose float noise could tip the rounding of a half tick). 0, no price, where
    anything is NaN or the result is past 2**62 ticks."""
    k = np.rint(tick_index(px, tick) + ticks)
    b = tick_index(other, tick) + (-1.0 if buy else 1.0)
    t = min(k, b) if buy else max(k, b)
    if not abs(k + b) < 4.611686018427388e18:  # NaN, infinite, or past 2**62 ticks
        return 0
    return int(t)


@njit
def round_to_step(qty: float, step: float) -> float:
    """``qty`` down to the size step, forgiving float noise just under a step (1e-9 of a step), as
    :func:`at_units` gives that size; a NaN or infinite ``qty`` comes back as it is."""
    if not math.isfinite(qty):
        return float(qty)
    return at_units(np.trunc(qty / step + 1e-9) + 0.0, step)


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
