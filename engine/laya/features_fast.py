"""Features ``v0`` compiled (numba) from the books15 scanner's level arrays: the live tick path.

Bit-identical to :func:`engine.laya.features.features_v0` (same float64 operations in the same
order, one cast to float32 at the end; ``tests/test_laya_fast.py`` checks it over whole sessions),
but it reads the ``(4, 15)`` float64 array :class:`engine.venues.bitget_v2_fast.Books15Scanner`
fills, so a label exists before any event object is built for the frame.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from engine.events import BOOK_LEVELS
from engine.laya.features import ASK_OFFSET, IMBALANCE_INDEX, N_FEATURES, PX_MOD, SZ_MOD, SZ_SCALE

_LEVELS = BOOK_LEVELS
_N = N_FEATURES
_ASK = ASK_OFFSET
_IMB = IMBALANCE_INDEX
_PX_MOD = PX_MOD
_SZ_MOD = SZ_MOD
_SZ_SCALE = SZ_SCALE


@njit(cache=True, nogil=True)
def features_v0_levels(levels, out):  # pragma: no cover - compiled
    """``levels`` float64 (4, 15) = bid px, bid sz, ask px, ask sz (NaN = missing); ``out`` float32 (128,)."""
    for k in range(_N):
        out[k] = 0.0
    sum_bid = 0.0
    sum_ask = 0.0
    for i in range(_LEVELS):
        px = levels[0, i]
        sz = levels[1, i]
        if px == px:
            out[2 * i] = np.float32(px % _PX_MOD)
        if sz == sz:
            out[2 * i + 1] = np.float32((sz * _SZ_SCALE) % _SZ_MOD)
            sum_bid += sz
        px = levels[2, i]
        sz = levels[3, i]
        if px == px:
            out[_ASK + 2 * i] = np.float32(px % _PX_MOD)
        if sz == sz:
            out[_ASK + 2 * i + 1] = np.float32((sz * _SZ_SCALE) % _SZ_MOD)
            sum_ask += sz
    total = sum_bid + sum_ask
    if total != 0.0:
        out[_IMB] = np.float32((sum_bid - sum_ask) / total)


def warm_up() -> None:
    """Compile (or load from numba's cache) before the first real tick needs it."""
    levels = np.full((4, BOOK_LEVELS), np.nan)
    levels[:, 0] = (1.0, 1.0, 2.0, 1.0)
    features_v0_levels(levels, np.zeros(N_FEATURES, dtype=np.float32))


@njit(cache=True, nogil=True)
def _features_v0_columns(cols, out):  # pragma: no cover - compiled
    """``cols``: float64 (4, 15, n) = bid px, bid sz, ask px, ask sz per level and row (NaN = missing);
    ``out``: float32 (n, 128). Row r is the per-tick kernel of book r, so the two cannot drift apart."""
    for r in range(out.shape[0]):
        features_v0_levels(cols[:, :, r], out[r])


@njit(cache=True, nogil=True)
def features_v0_rows(levels, out):  # pragma: no cover - compiled
    """``levels``: float64 (n, 60) C-ordered rows of bid px, bid sz, ask px, ask sz (15 each, NaN =
    missing); ``out``: float32 (n, 128). The per-tick kernel per row, reading rows in memory order (the
    replay's streamed blocks are laid out so)."""
    for r in range(out.shape[0]):
        features_v0_levels(levels[r].reshape((4, _LEVELS)), out[r])


def features_v0_table(table: pa.Table) -> np.ndarray:
    """:func:`engine.laya.features.features_v0_batch` compiled: ``(n, 128)`` float32, bit-identical
    (``tests/test_laya.py``), one pass over the Arrow columns without the numpy temporaries."""
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
