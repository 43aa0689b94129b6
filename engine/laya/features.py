"""Laya's input features, version ``v0``: 128 float32 values from one ``books15`` snapshot.

Layout (the seed's), computed in float64 and cast to float32 once at the end:

- ``f[2i]   = bid_px_i % 1000``, ``f[2i+1]  = (bid_sz_i * 100) % 255``  for levels i = 0..14
- ``f[30+2i] = ask_px_i % 1000``, ``f[31+2i] = (ask_sz_i * 100) % 255``  for levels i = 0..14
- ``f[60] = (sum bid_sz - sum ask_sz) / (sum bid_sz + sum ask_sz)``, 0 when that denominator is 0
- ``f[61..127] = 0``

A missing level (NaN in memory, null on disk) contributes 0 everywhere, including the size sums.

There are two implementations on purpose: :func:`features_v0` is the per-tick path that live mode
and replay run on every snapshot, :func:`features_v0_batch` is the vectorised path over a whole
session (training, offline labelling). They are bit-identical: both accumulate the size sums level by
level, 0 to 14, in float64 (no pairwise ``ndarray.sum``), and ``tests/test_laya.py`` checks it over
whole sessions with ``np.array_equal``. Change one, change the other, and bump ``FEATURE_VERSION``:
models carry the version they were trained on and :class:`engine.laya.model.Laya` refuses a mismatch.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa

from engine.events import BOOK_LEVELS, BookSnapshot

FEATURE_VERSION: Final = "v0"
N_FEATURES: Final = 128

PX_MOD: Final = 1000.0
SZ_SCALE: Final = 100.0
SZ_MOD: Final = 255.0
ASK_OFFSET: Final = 2 * BOOK_LEVELS  # 30
IMBALANCE_INDEX: Final = 4 * BOOK_LEVELS  # 60


def features_v0(book: BookSnapshot, out: np.ndarray | None = None) -> np.ndarray:
    """Features of one snapshot, shape ``(128,)`` float32.

    ``out``, if given, must be a float32 array of shape ``(128,)``; it is filled and returned, so a
    caller on the tick path can reuse one buffer.
    """
    f = [0.0] * N_FEATURES
    bid_px, bid_sz, ask_px, ask_sz = book.bid_px, book.bid_sz, book.ask_px, book.ask_sz
    sum_bid = 0.0
    sum_ask = 0.0
    for i in range(BOOK_LEVELS):
        px = bid_px[i]
        sz = bid_sz[i]
        if px == px:  # NaN != NaN: a missing level stays 0
            f[2 * i] = px % PX_MOD
        if sz == sz:
            f[2 * i + 1] = (sz * SZ_SCALE) % SZ_MOD
            sum_bid += sz
        px = ask_px[i]
        sz = ask_sz[i]
        if px == px:
            f[ASK_OFFSET + 2 * i] = px % PX_MOD
        if sz == sz:
            f[ASK_OFFSET + 2 * i + 1] = (sz * SZ_SCALE) % SZ_MOD
            sum_ask += sz
    total = sum_bid + sum_ask
    if total != 0.0:
        f[IMBALANCE_INDEX] = (sum_bid - sum_ask) / total
    if out is None:
        return np.array(f, dtype=np.float64).astype(np.float32)
    out[:] = f  # float64 Python floats -> float32, same round-to-nearest as astype
    return out


def _side_columns(table: pa.Table, name: str) -> np.ndarray:
    """``(n, 15)`` float64 of ``<name>_0..14`` with nulls as NaN."""
    cols = [
        table.column(f"{name}_{i}").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        for i in range(BOOK_LEVELS)
    ]
    return np.column_stack(cols) if cols[0].shape[0] else np.empty((0, BOOK_LEVELS), dtype=np.float64)


def features_v0_batch(table: pa.Table) -> np.ndarray:
    """Features of every row of a ``books15`` table, shape ``(n, 128)`` float32, row for row equal
    to :func:`features_v0` of the same snapshot."""
    n = table.num_rows
    f = np.zeros((n, N_FEATURES), dtype=np.float64)
    if n == 0:
        return f.astype(np.float32)
    sums = []
    for side, offset in (("bid", 0), ("ask", ASK_OFFSET)):
        px = _side_columns(table, f"{side}_px")
        sz = _side_columns(table, f"{side}_sz")
        px_present = ~np.isnan(px)
        sz_present = ~np.isnan(sz)
        f[:, offset : offset + 2 * BOOK_LEVELS : 2] = np.where(px_present, np.remainder(px, PX_MOD), 0.0)
        f[:, offset + 1 : offset + 2 * BOOK_LEVELS : 2] = np.where(
            sz_present, np.remainder(sz * SZ_SCALE, SZ_MOD), 0.0
        )
        sz0 = np.where(sz_present, sz, 0.0)
        acc = np.zeros(n, dtype=np.float64)
        for i in range(BOOK_LEVELS):  # level order, like the per-tick loop (not pairwise .sum)
            acc += sz0[:, i]
        sums.append(acc)
    sum_bid, sum_ask = sums
    total = sum_bid + sum_ask
    nonzero = total != 0.0
    f[:, IMBALANCE_INDEX] = np.where(nonzero, (sum_bid - sum_ask) / np.where(nonzero, total, 1.0), 0.0)
    return f.astype(np.float32)
