import numpy as np
import pytest

from replay.tape_stream import Reorder, TapeDisorder


@pytest.mark.parametrize("group", [1, 7, 64, 1000])
def test_reorder_hands_rows_out_in_sorted_order_as_they_become_final(group):
    """Rows pushed in exchange order with arrivals drawn later (ties included): the list it builds a
    group at a time is the whole sort, and nothing comes out before its bound says it is final."""
    rng = np.random.default_rng(group)
    n = 3000
    exch = np.cumsum(rng.integers(0, 3, n))  # repeated times: ties in both streams
    loc = exch + rng.choice([0, 0, 1, 5, 40], n)
    seq = np.arange(n) * 2 + 1
    r = Reorder(n)
    for lo in range(0, n, group):
        hi = min(n, lo + group)
        bound = np.iinfo(np.int64).max if hi == n else int(exch[hi - 1])
        before = r.done
        out = r.push(loc[lo:hi], seq[lo:hi], np.arange(lo, hi), bound)
        assert (r.perm[before : r.done] == out).all()
        assert (loc[out] <= bound).all()
        # the lowest row still to come: the earliest not yet handed out, or the next to be pushed
        pending = np.setdiff1d(np.arange(hi), r.perm[: r.done])
        assert r.lowest_row(r.done, hi) == (pending.min() if len(pending) else hi)
    assert r.done == n
    assert (r.perm == np.lexsort((seq, loc))).all()


def test_reorder_refuses_a_bound_that_did_not_hold():
    r = Reorder(4)
    r.push(np.array([5, 9]), np.array([1, 2]), np.array([0, 1]), bound=9)
    with pytest.raises(TapeDisorder):  # a later row earlier than one already handed out
        r.push(np.array([7]), np.array([3]), np.array([2]), bound=10)
