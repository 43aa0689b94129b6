"""Exact float arithmetic for compiled decisions: Python's ``min``/``max`` tie and NaN behaviour and
CPython's ``round(x, n)``, so a compiled rule gives the value the same expression gives in Python.

Everything here is ``numba.njit``; with ``NUMBA_DISABLE_JIT=1`` it is plain Python, the readable
reference of the compiled code.
"""

from __future__ import annotations

import math

import numpy as np

from engine.jit import njit

NAN = math.nan
_SPLIT = 134217729.0  # 2**27 + 1 (Dekker)
_TWO52 = 4503599627370496.0
_TWO53 = 9007199254740992.0
POW10 = np.array([10.0**k for k in range(23)])


@njit(inline="always")
def pmin(a: float, b: float) -> float:
    """Python's ``min(a, b)`` on floats: ``b`` only if ``b < a``."""
    return b if b < a else a


@njit(inline="always")
def pmax(a: float, b: float) -> float:
    """Python's ``max(a, b)`` on floats: ``b`` only if ``b > a``."""
    return b if b > a else a


@njit
def pyround(x: float, nd: int) -> float:
    """CPython's ``round(x, nd)`` for every float and ``0 <= nd <= 22``, as a Python float.

    CPython rounds the exact binary value half-even and returns the nearest double: here the product
    ``x * 10**nd`` is taken with its exact rounding error (Dekker's two-product) and divided back
    once. From ``|x| * 10**nd >= 2**52`` on the product is an integer give or take that error
    (|lo| <= 1/2), so only a tie moves it, to the even neighbour; from ``2**53`` on the decimal grid is
    finer than the doubles around ``x``, whose rounding is then ``x`` itself. ``float()``: read as
    plain Python (NUMBA_DISABLE_JIT) the arithmetic gives numpy floats, which are not JSON numbers."""
    if not math.isfinite(x):
        return float(x)
    p = POW10[nd]
    ax = abs(x)
    hi = ax * p
    if hi > _TWO53:
        return float(x)
    # lo: the exact rounding error of ax * p
    c = _SPLIT * ax
    ah = c - (c - ax)
    al = ax - ah
    c = _SPLIT * p
    bh = c - (c - p)
    bl = p - bh
    lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl
    if hi >= _TWO52:
        if hi == _TWO53 and lo >= 0:
            return float(x)
        n = hi + 2.0 * lo if abs(lo) == 0.5 and hi - 2.0 * math.floor(hi / 2.0) != 0.0 else hi
    else:
        fl = math.floor(hi)
        r = hi - fl  # exact
        if r < 0.25:
            n = fl
        else:
            s = (r - 0.5) + lo  # its sign is the sign of the exact (r - 0.5 + lo)
            if s > 0:
                n = fl + 1.0
            elif s < 0:
                n = fl
            else:
                n = fl if fl - 2.0 * math.floor(fl / 2.0) == 0.0 else fl + 1.0
    res = n / p
    return float(-res if x < 0 or (x == 0 and math.copysign(1.0, x) < 0) else res)


@njit(inline="always")
def div_half_even(a: int, d: int) -> int:
    """``a / d`` rounded half-even (d > 0): ``Decimal.quantize``'s default rounding."""
    q = a // d
    r = a - q * d
    twice = 2 * r
    if twice > d or (twice == d and q % 2 != 0):
        q += 1
    return q


@njit(inline="always")
def mul_div_half_even(a: int, m: int, d: int) -> int:
    """``a * m / d`` rounded half-even (d > 0, ``|m| * d < 2**63``), as :func:`div_half_even` of the
    product, also where ``a * m`` passes int64 and the quotient does not: ``a = q * d + r`` with
    ``0 <= r < d``, so the quotient is ``q * m`` plus ``r * m / d``, whose product is below ``|m| * d``."""
    q = a // d
    n = (a - q * d) * m
    k = n // d
    base = q * m + k
    twice = 2 * (n - k * d)
    if twice > d or (twice == d and base % 2 != 0):
        base += 1
    return base
