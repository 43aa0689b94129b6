"""Laya's input features, version ``v0``: 128 float32 values from one ``books15`` snapshot.

Layout (the seed's), computed in float64 and cast to float32 once at the end:

- ``f[2i]   = bid_px_i % 1000``, ``f[2i+1]  = (bid_sz_i * 100) % 255``  for levels i = 0..14
- ``f[30+2i] = ask_px_i % 1000``, ``f[31+2i] = (ask_sz_i * 100) % 255``  for levels i = 0..14
- ``f[60] = (sum bid_sz - sum ask_sz) / (sum bid_sz + sum ask_sz)``, 0 when that denominator is 0
- ``f[61..127] = 0``

A missing level (NaN in memory, null on disk) contributes 0 everywhere, including the size sums.

One implementation, compiled: :func:`features_v0_levels` computes one snapshot from a ``(4, 15)``
float64 array (the live tick path hands it the books15 scanner's levels before any event object
exists); :func:`features_v0` (a ``BookSnapshot``), :func:`features_v0_batch` (an Arrow table:
training, replay's batch labels) and :func:`features_v0_rows` (replay's streamed blocks) run that
kernel per row. The size sums accumulate level by level, 0 to 14, in float64. Change the kernel and
bump ``FEATURE_VERSION``: models carry the version they were trained on and
:class:`engine.laya.model.Laya` refuses a mismatch.

The residues (``px % 1000``, ``(sz * 100) % 255``) use :func:`pymod`: a float ``%`` compiles to a libm
``fmod`` call, ~10 ns, and 60 of them were ~2/3 of the kernel's time; ``pymod`` computes the same
double from a floor and a multiply (exact: the proof is in its docstring), ~3x faster.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa

from engine.events import BOOK_LEVELS, BookSnapshot
from engine.jit import njit

FEATURE_VERSION: Final = "v0"
N_FEATURES: Final = 128

PX_MOD: Final = 1000.0
SZ_SCALE: Final = 100.0
SZ_MOD: Final = 255.0
ASK_OFFSET: Final = 2 * BOOK_LEVELS  # 30
IMBALANCE_INDEX: Final = 4 * BOOK_LEVELS  # 60


_PX_INV = 1.0 / PX_MOD
_SZ_INV = 1.0 / SZ_MOD
_FAST_BELOW = 2.0**49  # q = floor(x / m) stays far below 2**53 / m, so q * m is an exact integer


@njit(nogil=True, inline="always")
def pymod(x, m, inv):  # pragma: no cover - compiled
    """Python's ``x % m`` for a positive integer-valued ``m`` (1000.0, 255.0) and ``inv = 1 / m``.
    The result is the same double, bit for bit.

    For ``0 <= x < 2**49``:
    - ``q = floor(x * inv)`` is ``floor(x / m)`` off by at most one (relative error ~2**-52 of a
      quotient < 2**40), and ``q * m`` is an exact integer.
    - ``x - q * m`` is exact. Its true value is the residue ``r0 = fmod(x, m)``, which is always
      representable, or ``r0 - m``, or ``r0 + m``. The value is a multiple of ulp(x). When
      ``q >= 1`` its magnitude stays below ``2**(exponent(x) + 1)``; when ``x < m``, Sterbenz's
      lemma applies.
    - One addition or subtraction of ``m`` then lands on ``r0``. That sum is a representable value,
      so it is exact.
    - A zero residue comes out as ``+0.0``, as Python gives it.

    Anything else goes to numba's own ``%``: negatives, ``-0.0``, huge values and inf. NaN never
    reaches here, because the callers skip it. ``tests/engine/laya/test_laya.py`` checks edges and near
    multiples against CPython."""
    if x > 0.0 and x < _FAST_BELOW:
        q = np.floor(x * inv)
        r = x - q * m
        if r < 0.0:
            r += m
        elif r >= m:
            r -= m
        return r
    return x % m


@njit(nogil=True)
def features_v0_levels(levels, out):  # pragma: no cover - compiled
    """``levels`` float64 (4, 15) = bid px, bid sz, ask px, ask sz (NaN = missing); ``out`` float32 (128,)."""
    for k in range(N_FEATURES):
        out[k] = 0.0
    sum_bid = 0.0
    sum_ask = 0.0
    for i in range(BOOK_LEVELS):
        px = levels[0, i]
        sz = levels[1, i]
        if px == px:
            out[2 * i] = np.float32(pymod(px, PX_MOD, _PX_INV))
        if sz == sz:
            out[2 * i + 1] = np.float32(pymod(sz * SZ_SCALE, SZ_MOD, _SZ_INV))
            sum_bid += sz
        px = levels[2, i]
        sz = levels[3, i]
        if px == px:
            out[ASK_OFFSET + 2 * i] = np.float32(pymod(px, PX_MOD, _PX_INV))
        if sz == sz:
            out[ASK_OFFSET + 2 * i + 1] = np.float32(pymod(sz * SZ_SCALE, SZ_MOD, _SZ_INV))
            sum_ask += sz
    total = sum_bid + sum_ask
    if total != 0.0:
        out[IMBALANCE_INDEX] = np.float32((sum_bid - sum_ask) / total)


def warm_up() -> None:
    """Compile (or load from numba's cache) before the first real tick needs it."""
    levels = np.full((4, BOOK_LEVELS), np.nan)
    levels[:, 0] = (1.0, 1.0, 2.0, 1.0)
    features_v0_levels(levels, np.zeros(N_FEATURES, dtype=np.float32))


@njit(nogil=True)
def _features_v0_columns(cols, out):  # pragma: no cover - compiled
    """``cols``: float64 (4, 15, n) = bid px, bid sz, ask px, ask sz per level and row (NaN = missing);
    ``out``: float32 (n, 128). Row r is the per-tick kernel of book r, so the two cannot drift apart."""
    for r in range(out.shape[0]):
        features_v0_levels(cols[:, :, r], out[r])


@njit(nogil=True)
def features_v0_rows(levels, out):  # pragma: no cover - compiled
    """``levels``: float64 (n, 60) C-ordered rows of bid px, bid sz, ask px, ask sz (15 each, NaN =
    missing); ``out``: float32 (n, 128). The per-tick kernel per row, reading rows in memory order (the
    replay's streamed blocks are laid out so)."""
    for r in range(out.shape[0]):
        features_v0_levels(levels[r].reshape((4, BOOK_LEVELS)), out[r])


def features_v0_batch(table: pa.Table) -> np.ndarray:
    """Features of every row of a ``books15`` table, shape ``(n, 128)`` float32: the per-tick kernel
    per row, in one pass over the Arrow columns."""
    n = table.num_rows
    out = np.zeros((n, N_FEATURES), dtype=np.float32)
    if n == 0:
        return out
    cols = np.empty((4, BOOK_LEVELS, n), dtype=np.float64)
    for k, side in enumerate(("bid_px", "bid_sz", "ask_px", "ask_sz")):
        for i in range(BOOK_LEVELS):
            cols[k, i] = table.column(f"{side}_{i}").to_numpy(zero_copy_only=False)  # nulls -> NaN
    _features_v0_columns(cols, out)
    return out


def features_v0(book: BookSnapshot, out: np.ndarray | None = None) -> np.ndarray:
    """Features of one snapshot, shape ``(128,)`` float32. ``out``, if given, must be a float32 array
    of shape ``(128,)``; it is filled and returned, so a caller on the tick path can reuse one buffer."""
    levels = np.array((book.bid_px, book.bid_sz, book.ask_px, book.ask_sz), dtype=np.float64)
    if out is None:
        out = np.empty(N_FEATURES, dtype=np.float32)
    features_v0_levels(levels, out)
    return out
