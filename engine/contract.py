"""Contract configuration (tick, size step, fees), as Bitget's /api/v2/mix/market/contracts gives it,
and its price and size rounding, compiled once for the engine, the strategy and the replay kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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


# ---------------------------------------------------------------- a session's instrument specifications
# A session names each instrument's contract in its manifest (``contracts``: {symbol: spec}), so a replay
# trades what the data was recorded on, not Bitget's BTCUSDT perpetual whatever the market. Numbers are
# decimal strings, as exchanges write them: a float's repr would turn 0.00001 into 1e-05.
CONTRACT_TYPES = ("perpetual", "spot")
SPEC_SOURCES = ("exchange", "known", "inferred")
SPEC_FIELDS = ("tick", "size_step", "min_qty", "maker_fee_rate", "taker_fee_rate", "contract_type")

# Published specs of the markets the importers read, as each venue's instrument endpoint gave them (and
# its standard, lowest-tier fees). A spec is only used where the data lies on its grids: a symbol whose
# tick changed since, or another market, falls back to what the data shows.
_BITGET_PERP_FEES = {"maker_fee_rate": "0.0002", "taker_fee_rate": "0.0006"}
_BINANCE_PERP_FEES = {"maker_fee_rate": "0.0002", "taker_fee_rate": "0.0005"}
_BINANCE_SPOT_FEES = {"maker_fee_rate": "0.001", "taker_fee_rate": "0.001"}
_BITGET_SPOT_FEES = {"maker_fee_rate": "0.001", "taker_fee_rate": "0.001"}
KNOWN_SPECS: dict[tuple[str, str], dict[str, dict[str, str]]] = {
    ("bitget", "perpetual"): {
        "BTCUSDT": {"tick": "0.1", "size_step": "0.001", "min_qty": "0.001", **_BITGET_PERP_FEES},
        "ETHUSDT": {"tick": "0.01", "size_step": "0.01", "min_qty": "0.01", **_BITGET_PERP_FEES},
    },
    ("binance", "perpetual"): {
        "BTCUSDT": {"tick": "0.1", "size_step": "0.001", "min_qty": "0.001", **_BINANCE_PERP_FEES},
        "ETHUSDT": {"tick": "0.01", "size_step": "0.001", "min_qty": "0.001", **_BINANCE_PERP_FEES},
    },
    ("binance", "spot"): {
        "BTCUSDT": {"tick": "0.01", "size_step": "0.00001", "min_qty": "0.00001", **_BINANCE_SPOT_FEES},
        "ETHUSDT": {"tick": "0.01", "size_step": "0.0001", "min_qty": "0.0001", **_BINANCE_SPOT_FEES},
    },
}
# fees a venue charges when the data names none and the symbol is not known: its standard tier
VENUE_FEES = {
    ("bitget", "perpetual"): _BITGET_PERP_FEES,
    ("bitget", "spot"): _BITGET_SPOT_FEES,
    ("binance", "perpetual"): _BINANCE_PERP_FEES,
    ("binance", "spot"): _BINANCE_SPOT_FEES,
}


def dec_text(x: float | Decimal | str) -> str:
    """A unit or rate as a plain decimal string (no exponent): ``1e-05`` -> ``0.00001``."""
    d = Decimal(repr(x) if isinstance(x, float) else str(x)).normalize()
    return format(d, "f")


def spec_of(c: ContractConfig, *, contract_type: str, source: str, **notes: Any) -> dict[str, Any]:
    """``c`` as a manifest's spec of its instrument: the fields, where they came from (``source``, one of
    SPEC_SOURCES) and any ``notes`` (an ``origin`` naming the endpoint or table, a ``why``)."""
    if contract_type not in CONTRACT_TYPES or source not in SPEC_SOURCES:
        raise ValueError(f"contract type {contract_type!r} / spec source {source!r}")
    return {
        "tick": dec_text(c.tick),
        "size_step": dec_text(c.size_step),
        "min_qty": dec_text(c.min_qty),
        "maker_fee_rate": dec_text(c.maker_fee_rate),
        "taker_fee_rate": dec_text(c.taker_fee_rate),
        "contract_type": contract_type,
        "spec_source": source,
        **notes,
    }


def contract_of(symbol: str, spec: dict[str, Any]) -> ContractConfig:
    """A manifest's spec of ``symbol`` as the engine's contract, or one error line naming the field."""
    try:
        return ContractConfig(
            symbol=symbol,
            tick=float(Decimal(str(spec["tick"]))),
            size_step=float(Decimal(str(spec["size_step"]))),
            min_qty=float(Decimal(str(spec.get("min_qty", spec["size_step"])))),
            maker_fee_rate=Decimal(str(spec["maker_fee_rate"])),
            taker_fee_rate=Decimal(str(spec["taker_fee_rate"])),
        )
    except (KeyError, ArithmeticError, ValueError, TypeError) as e:
        raise DualhubError(
            f"the session's contract spec of {symbol} is unusable ({type(e).__name__}: {e})"
        ) from None


def _finite_positive(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v) & (v > 0)]


def grid_unit(values: np.ndarray) -> float | None:
    """The unit of the finest decimal any value needs (``Decimal(repr(v))`` as the core reads it): a
    grid that holds every value of the data. Not their gcd: a short capture's sizes can all be tens
    by chance, and a step coarser than the venue's would refuse orders it takes. None for no positive
    value, or one that needs more than 12 decimals or integers past 2**53."""
    v = _finite_positive(values)
    if not len(v):
        return None
    v = np.unique(v)
    for d in range(13):
        p = POW10[d]
        scaled = v * p
        if not scaled.max() < _EXACT:
            return None
        if np.all(np.rint(scaled) / p == v):
            return float(Decimal(1).scaleb(-d))
    return None


def on_grid(values: np.ndarray, unit: float) -> bool:
    """Every positive value is a whole number of ``unit`` (a price of ticks, a size of lots), exactly
    as the core reads it (``engine.kernel._px_units``)."""
    v = _finite_positive(values)
    if not len(v):
        return True
    num, dec = unit_parts(unit, "unit")
    p = POW10[dec]
    n = np.rint(v * p)
    return bool(np.all(n / p == v) and np.all(np.mod(n, num) == 0))


def data_spec(
    symbol: str,
    prices: np.ndarray,
    sizes: np.ndarray,
    *,
    venue: str,
    contract_type: str,
    origin: str,
) -> dict[str, Any]:
    """The spec of ``symbol`` for an imported session: the venue's published one (``known``) where its
    grids hold every price and size of the data, else the grids the data shows (``inferred``: the
    finest tick and step that hold it, the step also the minimum size, the venue's standard fees)."""
    known = KNOWN_SPECS.get((venue, contract_type), {}).get(symbol)
    if known is not None:
        c = contract_of(symbol, known)
        if on_grid(prices, c.tick) and on_grid(sizes, c.size_step):
            return spec_of(c, contract_type=contract_type, source="known", origin=origin)
    tick, step = grid_unit(prices), grid_unit(sizes)
    if tick is None or step is None:
        what = "prices" if tick is None else "sizes"
        raise DualhubError(
            f"{symbol}: the data's {what} lie on no decimal grid of at most 12 decimals: no contract spec"
        )
    fees = VENUE_FEES.get((venue, contract_type), _BITGET_PERP_FEES)
    c = ContractConfig(
        symbol=symbol,
        tick=tick,
        size_step=step,
        min_qty=step,
        maker_fee_rate=Decimal(fees["maker_fee_rate"]),
        taker_fee_rate=Decimal(fees["taker_fee_rate"]),
    )
    why = "published spec does not hold the data" if known is not None else "no published spec known"
    return spec_of(
        c,
        contract_type=contract_type,
        source="inferred",
        origin=origin,
        why=f"{why}: tick and size step are the data's grids, fees {venue}'s standard {contract_type} tier",
    )


# The core's integer units (engine/kernel/units.py): a fill price as an integer of 10**-decimals below this,
# positions in units of the size step's decimals below 2**52 (a double holds them exactly), a fill's
# money in integers of 1e-12 USDT (or finer, price and size decimals together) below 2**62.
PX_UNITS_MAX = 1e15
LOTS_MAX = 2.0**52
MONEY_UNITS_MAX = 2.0**62


def check_units(c: ContractConfig, max_px: float, max_position: float, max_order_qty: float) -> None:
    """One error line naming the limit and the instrument where the core's integers cannot hold ``c``'s
    data: its highest price in units of the tick's decimals, the largest position or order in lots, the
    notional of the largest order at the highest price in 1e-12 USDT."""
    sym = c.symbol
    try:
        px_dec = tick_parts(c.tick)[1]
        step_dec = step_parts(c.size_step)[1]
    except DualhubError as e:  # the core counts in integers of at most 12 decimals
        raise DualhubError(f"{sym}: {e}, the core's limit") from None
    if math.isfinite(max_px) and max_px * 10.0**px_dec >= PX_UNITS_MAX:
        raise DualhubError(
            f"{sym}: a price of {max_px!r} at a tick of {dec_text(c.tick)} is {max_px * 10.0**px_dec:.3g} "
            f"units of 1e-{px_dec}, past the core's limit of 1e15 price units: give a coarser tick "
            f"(--instrument {sym}:tick=T)"
        )
    for what, q in (("max_position", max_position), ("max_order_qty", max_order_qty)):
        # a position is held as lots x the step's numerator (engine.kernel.position_words): a size in
        # units of the step's decimals
        if math.isfinite(q) and q * 10.0**step_dec >= LOTS_MAX:
            raise DualhubError(
                f"{sym}: {what} {q!r} is {q * 10.0**step_dec:.3g} units of 1e-{step_dec} (size step "
                f"{dec_text(c.size_step)}), past the core's limit of 2**52: give a coarser size step "
                f"(--instrument {sym}:size_step=S)"
            )
    if math.isfinite(max_px) and math.isfinite(max_order_qty):
        # a fill's price x size is counted exactly first, in units of 10**-(price + size decimals),
        # then in the 1e-12 USDT money is kept in: the finer of the two must hold it
        digits = max(12, px_dec + step_dec)
        notional = max_px * max_order_qty * 10.0**digits
        if notional >= MONEY_UNITS_MAX:
            raise DualhubError(
                f"{sym}: an order of max_order_qty {max_order_qty!r} at {max_px!r} is {notional:.3g} units "
                f"of 1e-{digits} USDT, past the core's limit of 2**62 money units per fill: give a smaller "
                f"max_order_qty (--instrument {sym}:max_order_qty=Q)"
            )
