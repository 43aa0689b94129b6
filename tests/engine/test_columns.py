"""The compiled string columns of the core's output (order ids, span refs, texts of codes) are the
strings Arrow's own cast, join and take give."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.columns import prefixed as _prefixed
from engine.columns import texts


@pytest.mark.parametrize("prefix", ["dh-", "kev:", ""])
def test_prefixed_ids_are_arrows_strings(prefix):
    rng = np.random.default_rng(7)
    edges = [0, -1, 9, 10, 99, 100, 10**18, 2**63 - 1, -(2**63), -(2**63) + 1]
    for n in (
        np.arange(0, 5000, dtype=np.int64) * 7,
        rng.integers(-(2**63), 2**63 - 1, 2000),
        np.array(edges, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.arange(40, dtype=np.int64)[::3],  # a strided view, as the output buffers' columns are
    ):
        got = _prefixed(prefix, n)
        got.validate(full=True)
        want = pc.binary_join_element_wise(prefix, pc.cast(pa.array(n), pa.string()), "")
        assert got.equals(want)
    assert _prefixed("dh-", np.array([42, -3])).to_pylist() == ["dh-42", "dh--3"]


def test_prefixes_chosen_per_row_are_arrows_if_else_of_each():
    rng = np.random.default_rng(11)
    n = rng.integers(-(2**63), 2**63 - 1, 3000)
    which = rng.integers(0, 3, 3000)
    got = _prefixed(("dh-", "kev:", "é"), n, which[:, None].repeat(2, axis=1)[:, 1])  # strided too
    got.validate(full=True)
    each = [
        pc.binary_join_element_wise(p, pc.cast(pa.array(n), pa.string()), "") for p in ("dh-", "kev:", "é")
    ]
    want = pc.case_when(pc.make_struct(*(pa.array(which == k) for k in range(3))), *each)
    assert got.equals(want)
    with pytest.raises(IndexError):
        _prefixed(("dh-", "kev:"), n, which)  # a choice past the prefixes
    with pytest.raises(IndexError):
        _prefixed(("dh-", "kev:"), n, which[:10] % 2)  # not one per number


def test_texts_are_what_take_gives():
    # an empty and a non-ASCII text too, and texts of one, two and three whole 8-byte words and between
    values = ("new", "cancel", "", "kill_switch", "né", "exactly8", "sixteen_bytes_xx", "seventeen_bytes_xy")
    rng = np.random.default_rng(3)
    for codes in (
        rng.integers(0, len(values), 5000),
        np.zeros(0, dtype=np.int64),
        rng.integers(0, len(values), (300, 4))[:, 2],  # a column of the output buffers: strided
        np.array([2, 2, 2]),
    ):
        got = texts(values, codes)
        got.validate(full=True)
        assert got.equals(pa.array(values, pa.string()).take(pa.array(codes.astype(np.int64))))
    with pytest.raises(IndexError):
        texts(values, np.array([0, len(values)]))
    with pytest.raises(IndexError):
        texts(values, np.array([-1]))
