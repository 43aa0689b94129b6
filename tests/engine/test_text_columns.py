"""The event log's compiled string columns give the bytes Arrow's own way gives: the same files and
digests."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine.text_columns import id_column, name_column


def _arrow_ids(prefix: str, values: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(values), pa.string()), "")


def test_ids_are_prefix_and_decimal_number_as_arrow_writes_them():
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [[0, 1, 9, 10, 99, 100, -1, -10, 2**62, -(2**62)], rng.integers(-(10**15), 10**15, 5000)]
    ).astype(np.int64)
    got = id_column(("dh-",), None, values)
    assert got.equals(_arrow_ids("dh-", values))
    assert got.to_pylist()[:7] == ["dh-0", "dh-1", "dh-9", "dh-10", "dh-99", "dh-100", "dh--1"]


def test_ids_with_a_prefix_per_row_and_columns_read_in_place():
    rows = np.arange(40, dtype=np.int64).reshape(10, 4)  # a strided column, as the core's row buffers
    which = rows[:, 1] % 2
    got = id_column(("dh-", "kév:"), which, rows[:, 2])
    want = pc.if_else(pa.array(which == 1), _arrow_ids("kév:", rows[:, 2]), _arrow_ids("dh-", rows[:, 2]))
    assert got.equals(want) and got.to_pylist()[1] == "kév:6"


def test_names_by_code_as_take_gives_them():
    names = ("buy", "", "cancel_ack", "ü")
    codes = np.array([[0, 2], [1, 3], [3, 0], [2, 2]], dtype=np.int64)[:, 1]  # strided too
    got = name_column(names, codes)
    assert got.equals(pa.array(names, pa.string()).take(pa.array(codes.copy())))
    assert got.to_pylist() == ["cancel_ack", "ü", "buy", "cancel_ack"]
    assert name_column(["BTCUSDT"], np.zeros(0, dtype=np.int64)).to_pylist() == []
    assert id_column(("dh-",), None, np.zeros(0, dtype=np.int64)).to_pylist() == []


@pytest.mark.parametrize("codes", [[0, 3], [-1]])
def test_a_code_out_of_range_is_an_error_not_garbage(codes):
    with pytest.raises(IndexError):
        name_column(("a", "b", "c"), np.array(codes))
    with pytest.raises(IndexError):
        id_column(("a", "b", "c"), np.array(codes), np.array([1] * len(codes)))
