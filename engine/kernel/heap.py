"""The timer heap (HI/HF): every timer of a core (an order or cancel reaching the venue, a report reaching
the engine, a Kev reply or timeout), the least (time, priority, seq) first.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.jit import njit
from engine.kernel.layout import HF_COLS, HI_COLS, OI_REFS, S_HEAP_N, S_HEAP_SEQ, T_REPORT

# ---------------------------------------------------------------- timer heap


class Heap(NamedTuple):
    """The timer heap, one parameter of every function that pushes or pops a timer: each timer's
    ``HI_COLS`` ints (time, priority, seq, kind, and its T_* kind's three arguments) and ``HF_COLS``
    floats, by heap position. Its arrays double when it fills (CoreState.heap is made from the current
    ones); the replay loop makes one from a core's arrays where it unpacks them."""

    HI: np.ndarray
    HF: np.ndarray


@njit
def _heap_push(S, heap, OI, ts, prio, kind, a, b, c6, f1, f2):
    seq = S[S_HEAP_SEQ]
    S[S_HEAP_SEQ] = seq + 1
    _heap_insert(S, heap, OI, ts, prio, seq, kind, a, b, c6, f1, f2)


@njit
def _heap_insert(S, heap, OI, ts, prio, seq, kind, a, b, c6, f1, f2):
    """A timer under a seq taken earlier (_heap_push takes the next)."""
    HI, HF = heap
    if kind <= T_REPORT:  # the timer names order a: its row stays taken until the timer ran
        OI[a & (OI.shape[0] - 1), OI_REFS] += 1
    n = S[S_HEAP_N]
    i = n
    S[S_HEAP_N] = n + 1
    # sift up
    while i > 0:
        parent = (i - 1) >> 1
        pt, pp, ps = HI[parent, 0], HI[parent, 1], HI[parent, 2]
        if pt < ts or (pt == ts and (pp < prio or (pp == prio and ps < seq))):
            break
        for c in range(HI_COLS):
            HI[i, c] = HI[parent, c]
        HF[i, 0] = HF[parent, 0]
        HF[i, 1] = HF[parent, 1]
        i = parent
    HI[i, 0] = ts
    HI[i, 1] = prio
    HI[i, 2] = seq
    HI[i, 3] = kind
    HI[i, 4] = a
    HI[i, 5] = b
    HI[i, 6] = c6
    HF[i, 0] = f1
    HF[i, 1] = f2


@njit(inline="always")
def _less(HI, i, j):
    a0, b0 = HI[i, 0], HI[j, 0]
    if a0 != b0:
        return a0 < b0
    a1, b1 = HI[i, 1], HI[j, 1]
    if a1 != b1:
        return a1 < b1
    return HI[i, 2] < HI[j, 2]


@njit
def _heap_pop(S, heap, tmpi, tmpf):
    """Pop the least timer into tmpi/tmpf."""
    HI, HF = heap
    n = S[S_HEAP_N] - 1
    S[S_HEAP_N] = n
    for c in range(HI_COLS):
        tmpi[c] = HI[0, c]
    tmpf[0] = HF[0, 0]
    tmpf[1] = HF[0, 1]
    if n == 0:
        return
    # move last to root and sift down
    for c in range(HI_COLS):
        HI[0, c] = HI[n, c]
    HF[0, 0] = HF[n, 0]
    HF[0, 1] = HF[n, 1]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        m = left
        right = left + 1
        if right < n and _less(HI, right, left):
            m = right
        if not _less(HI, m, i):
            break
        for c in range(HI_COLS):
            t = HI[i, c]
            HI[i, c] = HI[m, c]
            HI[m, c] = t
        for c in range(HF_COLS):
            t2 = HF[i, c]
            HF[i, c] = HF[m, c]
            HF[m, c] = t2
        i = m
