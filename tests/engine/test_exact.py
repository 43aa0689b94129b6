"""engine/exact.py: integer rounding the core's money relies on, against Python's exact integers."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np

from engine.exact import div_half_even, mul_div_half_even


def _half_even(x: Fraction) -> int:
    return round(x)  # Fraction.__round__ rounds half to even


def test_mul_div_half_even_is_the_exact_quotient_where_the_product_passes_int64():
    rng = random.Random(5)
    cases = [(a, m, 10**e) for a, m, e in ((5, 1, 1), (15, 1, 1), (-5, 1, 1), (-15, 1, 1), (25, 3, 2))]
    for _ in range(3000):
        e = rng.randint(0, 12)
        d = 10**e
        top = min(d - 1, 2**62 // d)  # a fee rate below 1 in magnitude, m / d, with |m| x d < 2**62
        m = rng.randint(-top, top)
        a = rng.randint(-(2**62), 2**62)
        cases.append((a, m, d))
    overflowed = 0
    for a, m, d in cases:
        want = _half_even(Fraction(a * m, d))
        got = int(mul_div_half_even(np.int64(a), np.int64(m), np.int64(d)))
        assert got == want, (a, m, d)
        if abs(a * m) < 2**63:
            assert int(div_half_even(np.int64(a * m), np.int64(d))) == want
        else:
            overflowed += 1
    assert overflowed > 1000  # the cases the single division cannot take
