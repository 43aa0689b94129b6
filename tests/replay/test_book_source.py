"""replay/book_source.py: the level columns of a block become rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from engine.validate import LEVEL_COLUMNS
from replay.book_source import _ALL, _column, rows_of


def test_level_columns_with_and_without_nulls_become_the_rows_np_stack_makes():
    """A column with a null comes out of Arrow as a copy, one without as a read-only view: the tiled
    copy takes both in one tuple, and writes what np.stack writes."""
    rng = np.random.default_rng(1)
    n = 200  # more than one tile of rows, and not a multiple of it
    cols = {c: rng.random(n) for c in LEVEL_COLUMNS}
    nulls = np.arange(n) % 7 == 0
    table = pa.table({c: pa.array(v, mask=nulls if k % 2 else None) for k, (c, v) in enumerate(cols.items())})
    arrays = tuple(_column(table, c) for c in LEVEL_COLUMNS)
    out = np.empty((n, len(LEVEL_COLUMNS)))
    rows_of(arrays, out, _ALL)
    want = np.stack([table.column(c).to_numpy(zero_copy_only=False) for c in LEVEL_COLUMNS], axis=1)
    assert np.array_equal(out, want, equal_nan=True)
    assert np.isnan(out[0, 1]) and not np.isnan(out[0, 0])


def test_picked_rows_are_those_rows_of_the_columns_in_the_order_picked():
    """A portfolio's symbol takes its rows of a shared row group: rows_of with ``pick`` writes exactly
    those rows (any order, repeats allowed), as a take of each column would."""
    rng = np.random.default_rng(2)
    n = 300
    cols = tuple(rng.random(n) for _ in LEVEL_COLUMNS)
    pick = np.concatenate([np.flatnonzero(rng.random(n) < 0.5), [0, 0, n - 1]]).astype(np.int64)
    out = np.empty((len(pick), len(LEVEL_COLUMNS)))
    rows_of(cols, out, pick)
    assert np.array_equal(out, np.stack([c[pick] for c in cols], axis=1))
