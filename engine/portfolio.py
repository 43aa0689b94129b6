"""Exact portfolio accounting: position, cash and fees as Decimals (never float-accumulated)."""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class Portfolio:
    position: Decimal = Decimal(0)
    cash: Decimal = Decimal(0)
    fees: Decimal = Decimal(0)
    volume: Decimal = Decimal(0)
    fills: int = 0
    _marks: list[Decimal] = field(default_factory=list)

    def apply_fill(self, side: str, px: float, qty: float, fee_rate: Decimal) -> tuple[Decimal, Decimal]:
        """Book a fill; returns its (notional, fee)."""
        q = dec(qty)
        # Money is kept to 1e-12 (the event schema's decimal128 scale): a price times a size with many
        # decimals (recorded trade sizes need not be size-step multiples) can have more, which the
        # event log could not store exactly. Rounding is half-even, once per fill, never accumulated.
        notional = (dec(px) * q).quantize(MONEY_QUANTUM)
        fee = (notional * fee_rate).quantize(MONEY_QUANTUM)
        self.position += q if side == "buy" else -q
        self.cash += -notional if side == "buy" else notional
        self.cash -= fee
        self.fees += fee
        self.volume += notional
        self.fills += 1
        return notional, fee
