"""Money as exact decimals: an exchange float back to its decimal, and a Decimal as the integers of
1e-12 the decision core keeps money in (``engine/kernel/units.py``)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

MONEY_QUANTUM = Decimal("1e-12")


def dec(x: float) -> Decimal:
    """A float parsed from an exchange string back to that exact decimal (shortest repr round-trips).
    ``float()`` first: a compiled rule read as plain Python (NUMBA_DISABLE_JIT) hands back numpy
    floats, whose repr is not a number."""
    return Decimal(repr(float(x)))


def units(x: Decimal | float) -> int:
    """``x`` (a Decimal, or a float read as :func:`dec` reads it) as an integer of MONEY_QUANTUM, rounded
    half-even: exact for the portfolio's cash and fees (quantized to it) and for a position of sizes
    with at most 12 decimals. The risk rules and the replay kernel keep money and position so."""
    d = x if isinstance(x, Decimal) else dec(x)
    return int(d.scaleb(12).to_integral_value(rounding=ROUND_HALF_EVEN))
