"""Exact arithmetic for the risk rules' edges: the sign of a sum of products, decided without rounding.

The rules (``engine/risk.py``) first decide in floats, and come here only when the float answer is
within its own rounding of the edge (:func:`clear`). Here prices and sizes are what the exchange's
strings say: a price is the decimal of fewest places (up to 12) whose double it is (:func:`dec_places`),
held as an integer count of ``10**-places`` (exact below 2**53); a size is whole lots, ``lots * num /
den`` of the step's exact fraction (``engine.contract.grid``). Limits, bps and USD amounts are the
numbers given, exactly the doubles they are. A comparison is then the sign of a short sum of products
of such numbers: each product is split into two doubles that add up to it exactly (Dekker), and the
sum's sign is read off Shewchuk's expansion of it. Nothing rounds, so an order exactly at a limit
passes and one a unit past it does not, at any magnitude the guard (:func:`tame`) admits; outside it
the rules fail closed.
"""

from __future__ import annotations

import math

import numpy as np

from engine.exact import POW10
from engine.jit import njit

_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a float into two 26-bit halves
_TAME_LO = 2.0**-250  # products of three such values neither overflow nor lose bits below 2**-1022
_TAME_HI = 2.0**250
_EXACT = 9007199254740992.0  # 2**53: integers below it are exact doubles
TOL = 1e-12  # a float answer farther than this (relative to its terms) from the edge is sure


@njit(inline="always")
def two_sum(a, b):
    """``a + b`` and its rounding error, exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit(inline="always")
def two_prod(a, b):
    """``a * b`` and its rounding error, exactly (Dekker; no FMA needed)."""
    p = a * b
    c = _SPLIT * a
    ah = c - (c - a)
    al = a - ah
    c = _SPLIT * b
    bh = c - (c - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@njit(inline="always")
def tame(x) -> bool:
    """``x`` is 0 or within 2**-250 .. 2**250 in magnitude: the exact path's products of up to three
    such factors are exact there. NaN and infinities are not."""
    a = abs(x)
    return a == 0.0 or _TAME_LO <= a <= _TAME_HI


@njit(inline="always")
def clear(est, mag) -> int:
    """Whether a float estimate ``est`` of a quantity whose terms add up to ``mag`` in magnitude
    settles its sign: 1 or -1, or 0 when it is within rounding of zero (or NaN) and the exact path
    must decide. An infinite estimate is sure of its sign (an infinite limit, or a size past doubles)."""
    if est == math.inf:
        return 1
    if est == -math.inf:
        return -1
    if est > TOL * mag:
        return 1
    if est < -TOL * mag:
        return -1
    return 0


@njit
def sign_of_sum(t, n) -> int:
    """The sign (-1, 0, 1) of the exact sum of ``t[:n]``: Shewchuk's grow-expansion turns them, in
    place, into non-overlapping components of increasing magnitude; the largest non-zero one carries
    the sign."""
    for k in range(n):
        q = t[k]
        for i in range(k):
            q, h = two_sum(q, t[i])
            t[i] = h
        t[k] = q
    for i in range(n - 1, -1, -1):
        if t[i] != 0.0:
            return 1 if t[i] > 0.0 else -1
    return 0


@njit(inline="always")
def put2(t, n, a, b) -> int:
    """Append ``a * b`` to ``t`` at ``n`` as two terms; the new count."""
    p, e = two_prod(a, b)
    t[n] = p
    t[n + 1] = e
    return n + 2


@njit(inline="always")
def put3(t, n, a, b, c) -> int:
    """Append ``a * b * c`` to ``t`` at ``n`` as four terms; the new count."""
    p, e = two_prod(a, b)
    n = put2(t, n, p, c)
    return put2(t, n, e, c)


@njit(inline="always")
def _count_at(x, d) -> float:
    """``x`` as a whole count of ``10**-d`` below 2**53 whose quotient reads back as ``x``, or NaN. The
    product ``x * 10**d`` rounds, so the count may be the one beside it."""
    k = np.rint(x * POW10[d])
    for j in (k, k - 1.0, k + 1.0):
        if 1.0 <= j < _EXACT and j / POW10[d] == x:
            return j
    return math.nan


@njit
def dec_places(x) -> int:
    """The fewest decimal places (0..12) of a decimal whose double is ``x`` (a positive price, as an
    exchange string of it parses), its count of units of ``10**-places`` below 2**53; -1 if none."""
    if not 0.0 < x < math.inf:
        return -1
    for d in range(13):
        c = _count_at(x, d)
        if c == c:  # not NaN
            return d
    return -1


@njit(inline="always")
def units_at(x, d) -> float:
    """``x`` (of :func:`dec_places` ``<= d``) in units of ``10**-d``: an integer, or NaN past 2**53.
    ``d = -1``: some price of the comparison is no decimal of 12 places or fewer, and every price is
    then read as the double it is (NaN outside the guard's range)."""
    if d < 0:
        return x if tame(x) else math.nan
    return _count_at(x, d)


@njit(inline="always")
def scale_of(d) -> float:
    """What a price in units of :func:`units_at` is multiplied by to read in currency units' terms."""
    return POW10[d] if d >= 0 else 1.0


@njit(inline="always")
def common_places(a, b, c) -> int:
    """The decimal places of a grid all three prices are on (``c`` may be NaN: two prices), or -1."""
    da, db = dec_places(a), dec_places(b)
    dc = dec_places(c) if c == c else 0
    if min(da, db, dc) < 0:
        return -1
    return max(da, db, dc)


@njit(nrt=True)
def band_ok(band, px, bid, ask) -> bool:
    """``|px - mid| / mid * 1e4 <= band``, ``mid = (bid + ask) / 2``, prices read as their decimals:
    ``1e4 |2 px - bid - ask| <= band (bid + ask)``, exactly."""
    s = bid + ask
    c = clear(band * s - abs(2.0 * px - s) * 1e4, band * s + 1e4 * (2.0 * px + s))
    if c != 0:
        return c > 0
    d = common_places(px, bid, ask)
    if not tame(band):
        return False
    kp, kb, ka = units_at(px, d), units_at(bid, d), units_at(ask, d)
    if not (kp == kp and kb == kb and ka == ka):
        return False
    t = np.empty(10)
    t[0], t[1], t[2] = 2.0 * kp, -kb, -ka
    g = float(sign_of_sum(t, 3)) * 1e4  # |D| = sign(D) D
    n = put2(t, 0, band, kb)
    n = put2(t, n, band, ka)
    n = put2(t, n, -g, 2.0 * kp)
    n = put2(t, n, g, kb)
    n = put2(t, n, g, ka)
    return sign_of_sum(t, n) >= 0


@njit(nrt=True)
def slip_ok(cap, lpx, lq, n, q, bid, ask) -> bool:
    """The average price of a walk (``n`` levels: prices ``lpx``, whole lots ``lq``, ``q`` lots in all)
    within ``cap`` bps of the mid: ``1e4 |2 sum(px lots) - q (bid + ask)| <= cap q (bid + ask)``, prices
    read as their decimals, exactly."""
    s = bid + ask
    num = 0.0
    mag = 0.0
    for j in range(n):
        num += lpx[j] * lq[j]
        mag += abs(lpx[j] * lq[j])
    c = clear(cap * q * s - abs(2.0 * num - q * s) * 1e4, cap * q * s + 1e4 * (2.0 * mag + q * s))
    if c != 0:
        return c > 0
    d = common_places(bid, ask, math.nan)
    for j in range(n):
        p = dec_places(lpx[j])
        d = max(d, p) if min(d, p) >= 0 else -1
    if not (tame(cap) and q < _EXACT):
        return False
    kb, ka = units_at(bid, d), units_at(ask, d)
    if not (kb == kb and ka == ka):
        return False
    t = np.empty(2 * n + 4)
    m = 0
    for j in range(n):
        k = units_at(lpx[j], d)
        if not k == k:
            return False
        m = put2(t, m, 2.0 * k, lq[j])
    m = put2(t, m, -q, kb)
    m = put2(t, m, -q, ka)
    dd = t[:m].copy()
    g = float(sign_of_sum(dd, m)) * 1e4
    u = np.empty(2 * m + 8)
    r = 0
    for j in range(m):
        r = put2(u, r, -g, t[j])
    r = put3(u, r, cap, q, kb)
    r = put3(u, r, cap, q, ka)
    return sign_of_sum(u, r) >= 0


@njit(nrt=True)
def usd_within(limit, lots, num, den, bid, ask, others) -> bool:
    """``|lots| * size * mid + others <= limit`` (a size of ``lots`` lots of the step ``num / den``;
    ``others`` a USD amount, >= 0), prices read as their decimals, exactly. ``|lots|`` is whole."""
    w = abs(lots)
    s = bid + ask
    v = w * (num / den) * s * 0.5
    c = clear(limit - v - others, limit + v + abs(others))
    if c != 0:
        return c > 0
    d = common_places(bid, ask, math.nan)
    if not (tame(limit) and tame(others) and w < _EXACT):
        return False
    kb, ka = units_at(bid, d), units_at(ask, d)
    if not (kb == kb and ka == ka):
        return False
    # 2 den 10**d (limit - others) - w num (kb + ka) >= 0
    t = np.empty(20)
    n = put3(t, 0, 2.0 * limit, den, scale_of(d))
    n = put3(t, n, -2.0 * others, den, scale_of(d))
    n = put3(t, n, -w, num, kb)
    n = put3(t, n, -w, num, ka)
    return sign_of_sum(t, n) >= 0


@njit(nrt=True)
def _net_terms(t, n, lots, num, den, kb, ka, d, others) -> int:
    """Append ``2 den 10**d (lots * size * mid + others)`` (exact terms) to ``t`` at ``n``."""
    n = put3(t, n, lots, num, kb)
    n = put3(t, n, lots, num, ka)
    return put3(t, n, 2.0 * others, den, scale_of(d))


@njit(nrt=True)
def net_towards_zero_ok(limit, after_lots, before_lots, num, den, bid, ask, others) -> bool:
    """A net USD delta ``after = after_lots * size * mid + others`` within ``limit``, or closer to zero
    than ``before`` (the same with ``before_lots``): ``|after| <= limit or |after| < |before|``,
    prices read as their decimals, exactly."""
    s = bid + ask
    sz = num / den
    a = after_lots * sz * s * 0.5 + others
    b = before_lots * sz * s * 0.5 + others
    ma = abs(after_lots * sz * s * 0.5) + abs(others)
    mb = abs(before_lots * sz * s * 0.5) + abs(others)
    c1 = clear(limit - abs(a), limit + ma)
    if c1 > 0:
        return True
    c2 = clear(abs(b) - abs(a), ma + mb)
    if c2 != 0 and c1 < 0:
        return c2 > 0
    d = common_places(bid, ask, math.nan)
    if not (tame(limit) and tame(others)):
        return False
    if not (abs(after_lots) * num < _EXACT and abs(before_lots) * num < _EXACT):
        return False
    kb, ka = units_at(bid, d), units_at(ask, d)
    if not (kb == kb and ka == ka):
        return False
    t = np.empty(12)
    n = _net_terms(t, 0, after_lots, num, den, kb, ka, d, others)
    sa = float(sign_of_sum(t[:n].copy(), n))
    u = np.empty(16)
    m = put3(u, 0, 2.0 * limit, den, scale_of(d))
    for j in range(n):
        u[m + j] = -sa * t[j]
    if sign_of_sum(u, m + n) >= 0:
        return True
    v = np.empty(12)
    k = _net_terms(v, 0, before_lots, num, den, kb, ka, d, others)
    sb = float(sign_of_sum(v[:k].copy(), k))
    w = np.empty(24)
    for j in range(k):
        w[j] = sb * v[j]
    for j in range(n):
        w[k + j] = -sa * t[j]
    return sign_of_sum(w, k + n) > 0


_WORD = 4294967296.0  # 2**32: money and position reach the rules as two words, hi * 2**32 + lo


@njit(nrt=True)
def pnl_above(stop, pos_hi, pos_lo, cash_hi, cash_lo, bid, ask, others) -> bool:
    """Whether ``cash + position * mid + others > -stop``: position and cash integers of 1e-12 as two
    words each (``hi * 2**32 + lo``, ``0 <= lo < 2**32``), prices read as their decimals, ``others`` a
    USD amount; decided exactly. Fails closed: a NaN, a word beyond 2**53, a price that is no decimal,
    or, in the exact case, an amount outside the guard's range stops."""
    if not (abs(pos_hi) <= 2**53 and abs(cash_hi) <= 2**53 and math.isfinite(others)):
        return False
    cash = (cash_hi * _WORD + cash_lo) * 1e-12
    pm = (pos_hi * _WORD + pos_lo) * 1e-12 * ((bid + ask) * 0.5)
    c = clear(cash + pm + others + stop, abs(cash) + abs(pm) + abs(others) + abs(stop))
    if c != 0:
        return c > 0
    d = common_places(bid, ask, math.nan)
    if not (tame(stop) and tame(others)):
        return False
    kb, ka = units_at(bid, d), units_at(ask, d)
    if not (kb == kb and ka == ka):
        return False
    # in units of 1e-12 USDT, times 2 * 10**d: 2 10**d cash + pos (kb + ka) + 2e12 10**d (others + stop)
    t = np.empty(26)
    n = put3(t, 0, 2.0 * cash_hi, _WORD, scale_of(d))
    n = put2(t, n, 2.0 * float(cash_lo), scale_of(d))
    n = put3(t, n, float(pos_hi), _WORD, kb)
    n = put3(t, n, float(pos_hi), _WORD, ka)
    n = put2(t, n, float(pos_lo), kb)
    n = put2(t, n, float(pos_lo), ka)
    n = put3(t, n, 2e12, others, scale_of(d))
    n = put3(t, n, 2e12, stop, scale_of(d))
    return sign_of_sum(t, n) > 0
