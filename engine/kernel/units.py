"""The core's integer units: money as two words of 1e-12 USDT, sizes and the position in whole lots of
the size step, prices in whole ticks, and the doubles they are reported as (``size_of``, ``price_of``).
"""

from __future__ import annotations

import numpy as np

from engine.contract import NO_PX
from engine.exact import POW10
from engine.jit import njit
from engine.kernel.layout import C_PX_DECIMALS, C_STEP_DEC, C_STEP_NUM, C_TICK_NUM, NAN, S_POS


@njit
def _px_units(px, dec):
    """``Decimal(repr(px))`` as an integer of 10**-dec, or -1 << 62 when it is not one."""
    p = POW10[dec]
    v = px * p
    if not (abs(v) < 1e15):
        return -(1 << 62)
    n = np.rint(v)
    if n / p != px:
        return -(1 << 62)
    return np.int64(n)


@njit(inline="always")
def _add_words(S, hi, lo, v):
    """``S[hi] * 2**32 + S[lo] += v`` (``|v| < 2**62``), keeping ``0 <= S[lo] < 2**32``: ``v >> 32``
    floors, so ``v == (v >> 32) * 2**32 + (v & 0xFFFFFFFF)`` for a negative ``v`` too."""
    w = S[lo] + (v & 0xFFFFFFFF)
    S[hi] += (v >> 32) + (w >> 32)
    S[lo] = w & 0xFFFFFFFF


@njit(inline="always")
def usdt(hi, lo):
    """Money kept as two words (integers of 1e-12 USDT), in USDT as a float."""
    return (hi * 4294967296.0 + lo) / 1e12


@njit(inline="always")
def size_of(lots, C):
    """The size of ``lots`` whole lots of the size step: the double nearest the exact decimal, as
    engine.contract.at_units gives it (one division of exact integers rounds once)."""
    return float(lots * C[C_STEP_NUM]) / POW10[C[C_STEP_DEC]]


@njit(inline="always")
def price_of(ticks, C):
    """The price of ``ticks`` whole ticks (OI_PX): the double nearest the exact decimal, as size_of
    gives a size (and engine.contract.at_units either); NaN for NO_PX, a market order's."""
    if ticks == NO_PX:
        return NAN
    return float(ticks * C[C_TICK_NUM]) / POW10[C[C_PX_DECIMALS]]


@njit
def _lots(q, C):
    """The size ``q`` as whole lots of the size step, or -1 << 62 when it is not exactly the size of
    some (the double size_of gives) or more than 2**52 of them."""
    n = np.rint(q * POW10[C[C_STEP_DEC]] / C[C_STEP_NUM])
    if not abs(n) < 2.0**52:
        return -(1 << 62)
    k = np.int64(n)
    if size_of(k, C) != q:
        return -(1 << 62)
    return k


@njit
def position_words(S, C):
    """The position in integers of 1e-12 (lots x step), as the risk rules' two words: ``hi * 2**32 +
    lo``, ``0 <= lo < 2**32``. Exact: _on_fill keeps ``|lots x C_STEP_NUM| < 2**52`` and ``m`` (the
    1e-12 units of one C_STEP_NUM) is below 2**40, so every product below stays within int64."""
    x = S[S_POS] * C[C_STEP_NUM]
    m = np.int64(10) ** (12 - C[C_STEP_DEC])
    xh = x >> 32  # x = xh * 2**32 + xl, 0 <= xl < 2**32 (xh floors for a negative x)
    xl = x & 0xFFFFFFFF
    mh = m >> 20  # m = mh * 2**20 + ml: xl * m itself would pass 2**63
    ml = m & 0xFFFFF
    a = xl * ml
    b = xl * mh  # b * 2**20 = (b >> 12) * 2**32 + (b & 0xFFF) * 2**20
    lo = a + ((b & 0xFFF) << 20)
    return xh * m + (b >> 12) + (lo >> 32), lo & 0xFFFFFFFF


@njit(inline="always")
def position(S, C):
    """The engine's position in base units (its whole lots of the size step, as size_of gives them)."""
    return size_of(S[S_POS], C)
