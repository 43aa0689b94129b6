"""The rows a step writes to the output streams (orders, risk verdicts, Kev's queue, latency spans, a
portfolio's instrument tags), and the room checked before each step (``headroom``): a step that could
overrun a buffer or table stops the run first, to grow it or drain it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.jit import njit
from engine.kernel.layout import (
    DONE,
    MARGIN,
    O_KEV_QUEUE,
    O_LATENCY,
    O_ORDER,
    O_RISK,
    OI_LOTS,
    OI_OID,
    OI_PX,
    OI_REFS,
    OI_RESTING,
    OI_SIDE,
    OI_STATUS,
    OI_TYPE,
    OUT_INST,
    S_HEAP_N,
    S_KEV_ASKED,
    S_LAG_N,
    S_LAG_USED,
    S_NWORK,
    S_OID,
    S_OLAT_USED,
    S_OLDEST,
    S_RID,
    S_RID_OLDEST,
    ST_DONE,
    ST_GROW_HEAP,
    ST_GROW_ORDERS,
    ST_GROW_REQUESTS,
    ST_GROW_WORK,
    ST_NEED_KEV,
    ST_NEED_LAGS,
    ST_NEED_LATENCIES,
    ST_OUT_FULL,
    STEP_ORDERS,
)
from engine.kernel.units import price_of, size_of

# ---------------------------------------------------------------- output


class Out(NamedTuple):
    """The output buffer, one parameter of every step that writes rows: each stream's int and float
    columns by row (``OUTI[stream, column, row]``, ``OUTF`` alike) and each stream's row count
    (``NOUT[stream]``). A NamedTuple, not a structref or jitclass: the core compiles without numba's
    reference counting, which both need, and a NamedTuple of arrays costs what its arrays passed one
    by one cost (bench/bench_named_state.py). Its arrays are made once and drained in place."""

    OUTI: np.ndarray
    OUTF: np.ndarray
    NOUT: np.ndarray


@njit
def tag_rows(OUTI, NOUT, before, inst):
    """Mark the rows each stream got since ``before`` (its row counts then) as instrument ``inst``'s."""
    for s in range(NOUT.shape[0]):
        for k in range(before[s], NOUT[s]):
            OUTI[s, OUT_INST, k] = inst


@njit
def headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight):
    """Room for one more step (ST_DONE), or the stop that makes it (ST_*): the replay loop checks it
    before each walk entry and timer, an engine driven per event before each event."""
    return _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight)


@njit
def _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight):
    if S[S_KEV_ASKED] > 0:  # the previous step started requests the advisor must answer first
        return ST_NEED_KEV
    for s in range(8):
        if NOUT[s] + MARGIN > out_cap:
            return ST_OUT_FULL
    # the ring: the next MARGIN orders must find rows no order in use holds
    mask = OI.shape[0] - 1
    oldest = S[S_OLDEST]
    while oldest <= S[S_OID]:
        r = oldest & mask
        if OI[r, OI_OID] == oldest and (
            OI[r, OI_STATUS] != DONE or OI[r, OI_REFS] != 0 or OI[r, OI_RESTING] != 0
        ):
            break  # still in use (an order the risk gateway refused never took a row)
        oldest += 1
    S[S_OLDEST] = oldest
    if S[S_OID] + MARGIN - oldest >= OI.shape[0]:
        return ST_GROW_ORDERS
    if S[S_HEAP_N] + MARGIN >= HI.shape[0]:
        return ST_GROW_HEAP
    if S[S_RID] + MARGIN - S[S_RID_OLDEST] >= RI.shape[0]:  # requests live in a ring, as orders do
        return ST_GROW_REQUESTS
    if S[S_NWORK] + STEP_ORDERS > work.shape[0] // 3:
        return ST_GROW_WORK
    if S[S_LAG_USED] + inflight.shape[0] > S[S_LAG_N]:  # a step starts fewer requests than fit in flight
        return ST_NEED_LAGS
    for k in range(3):  # a step sends fewer than MARGIN orders, cancels and reports
        if S[S_OLAT_USED + k] + MARGIN > olat.shape[1]:
            return ST_NEED_LATENCIES
    return ST_DONE


@njit
def _order_event(out, C, OI, OF, oid, kind, ts_event, ts_recv, reason):
    OUTI, OUTF, NOUT = out
    k = NOUT[O_ORDER]
    NOUT[O_ORDER] = k + 1
    OUTI[O_ORDER, 0, k] = ts_event
    OUTI[O_ORDER, 1, k] = ts_recv
    OUTI[O_ORDER, 2, k] = oid
    OUTI[O_ORDER, 3, k] = kind
    OUTI[O_ORDER, 4, k] = OI[oid & (OI.shape[0] - 1), OI_SIDE]
    OUTI[O_ORDER, 5, k] = OI[oid & (OI.shape[0] - 1), OI_TYPE]
    OUTI[O_ORDER, 6, k] = reason
    OUTF[O_ORDER, 0, k] = price_of(OI[oid & (OI.shape[0] - 1), OI_PX], C)
    OUTF[O_ORDER, 1, k] = size_of(OI[oid & (OI.shape[0] - 1), OI_LOTS], C)


@njit
def _span(OUTI, NOUT, name, ref_kind, ref_n, start, end):
    k = NOUT[O_LATENCY]
    NOUT[O_LATENCY] = k + 1
    OUTI[O_LATENCY, 0, k] = start
    OUTI[O_LATENCY, 1, k] = end
    OUTI[O_LATENCY, 2, k] = name
    OUTI[O_LATENCY, 3, k] = ref_kind
    OUTI[O_LATENCY, 4, k] = ref_n


@njit
def _queue_note(OUTI, NOUT, now, rid, kind, depth):
    k = NOUT[O_KEV_QUEUE]
    NOUT[O_KEV_QUEUE] = k + 1
    OUTI[O_KEV_QUEUE, 0, k] = now
    OUTI[O_KEV_QUEUE, 1, k] = rid
    OUTI[O_KEV_QUEUE, 2, k] = kind
    OUTI[O_KEV_QUEUE, 3, k] = depth


@njit
def _risk_row(out, now, oid, intent, side, otype, source, age, ok, reason, px, qty):
    OUTI, OUTF, NOUT = out
    k = NOUT[O_RISK]
    NOUT[O_RISK] = k + 1
    OUTI[O_RISK, 0, k] = now
    OUTI[O_RISK, 1, k] = oid
    OUTI[O_RISK, 2, k] = intent
    OUTI[O_RISK, 3, k] = side
    OUTI[O_RISK, 4, k] = otype
    OUTI[O_RISK, 5, k] = source
    OUTI[O_RISK, 6, k] = age
    OUTI[O_RISK, 7, k] = 1 if ok else 0
    OUTI[O_RISK, 8, k] = reason
    OUTF[O_RISK, 0, k] = px
    OUTF[O_RISK, 1, k] = qty
