"""The simulated exchange, written once, over state arrays: orders and cancels arriving after their
drawn latency, matching on arrival, resting orders filled by books and trades through the
queue-position models, and the reports sent back after the response latency.

Two shells run it. The replay's compiled loop keeps the venue in the engine's own state (its order
table, its timer heap) and calls these functions inline. :class:`venue.exchange.SimExchange` (the
per-event replay, live paper mode, the local Bitget exchange) gives it arrays of its own and moves
what it reports onto a Python clock. The matching and fill rules are ``venue/matching.py`` and
``venue/fills.py``; what is here is the bookkeeping of the resting orders and the reports.
"""

from __future__ import annotations

import numpy as np

from engine.contract import tick_index
from engine.jit import njit
from engine.kernel import (
    C_FILL_MODEL,
    C_OLAT_KEYED,
    CF_QUEUE_N,
    CF_SIZE_STEP,
    CF_TICK,
    KEY_FALLBACK,
    KEY_HEAD,
    KEY_MISSES,
    KEY_N,
    LIMIT,
    LIQ_MAKER,
    LIQ_TAKER,
    M_ACK,
    M_CANCEL_ACK,
    M_DONE,
    M_FILL,
    M_REJECT,
    MARKET,
    NAN,
    O_ORDER,
    OF_AHEAD,
    OF_LEVEL,
    OF_TRADED,
    OI_LOTS,
    OI_OID,
    OI_PX,
    OI_REDUCE,
    OI_RESTING,
    OI_SIDE,
    OI_TYPE,
    OI_XFILLED,
    OK_CANCEL,
    OK_NEW,
    OLAT_CANCEL,
    OLAT_ENTRY,
    OLAT_RESPONSE,
    PRIO_EXCH_IN,
    PRIO_EXCH_OUT,
    R_CANCEL_NOT_FOUND,
    R_FILLED,
    R_IOC,
    R_NO_MARKET,
    R_REDUCE_REJECTED,
    S_NOW,
    S_NREST,
    S_OLAT_USED,
    S_SENT,
    S_WHY,
    S_XBOOK,
    S_XPOS,
    T_ARRIVE,
    T_ARRIVE_CANCEL,
    T_REPORT,
    U_TABLE,
    _heap_push,
    drop_id,
    price_of,
    size_of,
)
from engine.risk_codes import only_reduces as _reduce_only_ok
from venue.fills import on_new
from venue.matching import AR_FILLED, AR_REST, book_fills, maker_fill, match_arrival, trade_fills


@njit
def _draw(S, C, olat, k):
    """The next latency of order latency model ``k`` (OLAT_*); a recorded model's is looked up by the
    time of the draw (S_NOW at every call here), as ``sample_ns`` is."""
    if C[C_OLAT_KEYED + k] != 0:
        return _recorded(olat[k], S[S_NOW])
    i = S[S_OLAT_USED + k]
    S[S_OLAT_USED + k] = i + 1
    return olat[k, i]


@njit
def _recorded(row, key):
    """RecordedLatency.sample_ns(key) on a table row (KEY_*): the key's next duration in recorded order;
    a key never recorded, or with none left, gets the fallback and counts a miss."""
    n = row[KEY_N]
    j = np.searchsorted(row[KEY_HEAD : KEY_HEAD + n], key)
    if j < n and row[KEY_HEAD + j] == key:
        p = row[KEY_HEAD + n + j]
        if p < row[KEY_HEAD + 2 * n + j]:
            row[KEY_HEAD + n + j] = p + 1
            return row[p]
    row[KEY_MISSES] += 1
    return row[KEY_FALLBACK]


@njit
def _report(S, C, OI, heap, olat, method, oid, arg, f1, f2):
    """A report (M_*) to the engine, which hears of it after the response latency, with ts_event = now:
    a timer in the heap, in the order the venue made them."""
    now = S[S_NOW]
    at = now + _draw(S, C, olat, OLAT_RESPONSE)
    _heap_push(S, heap, OI, at, PRIO_EXCH_OUT, T_REPORT, oid, method | (arg << 8), now, f1, f2)


@njit
def _report_fill(S, C, OI, heap, olat, oid, px, lots, liq):
    """A fill of ``lots`` reported as its size, the double of the exact decimal, as the exchange's
    string for it parses to."""
    _report(S, C, OI, heap, olat, M_FILL, oid, liq, px, size_of(lots, C))


@njit
def _x_fill(S, C, OI, heap, olat, rest, oid, px, lots):
    """A maker fill of ``lots`` on resting order ``oid``; done when nothing is left of it."""
    i = oid & (OI.shape[0] - 1)
    OI[i, OI_XFILLED], S[S_XPOS], done = maker_fill(
        OI[i, OI_SIDE], OI[i, OI_LOTS], OI[i, OI_XFILLED], S[S_XPOS], lots
    )
    _report_fill(S, C, OI, heap, olat, oid, px, lots, LIQ_MAKER)
    if done:
        if drop_id(S, S_NREST, rest, oid):
            OI[i, OI_RESTING] = 0
        _report(S, C, OI, heap, olat, M_DONE, oid, R_FILLED, 0.0, 0.0)


@njit(inline="always")  # returns a view: inlined, so no call hands a reference over
def _x_rest_rows(S, OF, rest):
    """The resting orders' rows in the order table, in arrival order, in rest's scratch half: the book
    as it was before fills remove orders from the first half."""
    cap = rest.shape[0] >> 1
    rows = rest[cap : 2 * cap]
    for w in range(S[S_NREST]):
        rows[w] = rest[w] & (OF.shape[0] - 1)
    return rows


@njit
def x_on_book(S, C, CF, OI, OF, heap, olat, rest, x_book):
    """A new book at the venue: venue.matching.book_fills over the order table, then its maker fills."""
    n = S[S_NREST]
    if n == 0:
        return
    rows = _x_rest_rows(S, OF, rest)
    k = book_fills(
        C[C_FILL_MODEL],
        CF[CF_QUEUE_N],
        x_book,
        CF[CF_TICK],
        rows,
        n,
        OI[:, OI_SIDE],
        OI[:, OI_PX],
        OF[:, OF_AHEAD],
        OF[:, OF_LEVEL],
        OF[:, OF_TRADED],
        rows,
    )
    for j in range(k):
        r = rows[j]
        left = OI[r, OI_LOTS] - OI[r, OI_XFILLED]
        _x_fill(S, C, OI, heap, olat, rest, OI[r, OI_OID], price_of(OI[r, OI_PX], C), left)


@njit(nrt=True)
def x_on_trade(S, C, CF, OI, OF, heap, olat, rest, px, sz, tside):
    """A public trade at the venue: venue.matching.trade_fills over the order table, then its maker fills."""
    n = S[S_NREST]
    rows = _x_rest_rows(S, OF, rest)
    fq = np.empty(n, dtype=np.int64)
    k = trade_fills(
        C[C_FILL_MODEL],
        CF[CF_SIZE_STEP],
        rows,
        n,
        OI[:, OI_SIDE],
        OI[:, OI_PX],
        OI[:, OI_LOTS],
        OI[:, OI_XFILLED],
        OF[:, OF_AHEAD],
        OF[:, OF_TRADED],
        tick_index(px, CF[CF_TICK]),
        sz,
        tside,
        rows,
        fq,
    )
    for j in range(k):
        r = rows[j]
        _x_fill(S, C, OI, heap, olat, rest, OI[r, OI_OID], price_of(OI[r, OI_PX], C), fq[j])


@njit
def x_arrive(S, C, CF, OI, OF, heap, olat, rest, x_book, oid, lpx, lq):
    """Order ``oid`` (its row of OI/OF filled in) reaches the venue: rejected without a book or as a
    reduce-only order that would not reduce; else acknowledged, its marketable part filled as taker,
    the rest expired (market) or resting in the queue (limit). A full resting list stops the call with
    S[S_WHY] = U_TABLE (the order does not rest)."""
    if S[S_XBOOK] == 0:
        _report(S, C, OI, heap, olat, M_REJECT, oid, R_NO_MARKET, 0.0, 0.0)
        return
    r = oid & (OF.shape[0] - 1)
    i = oid & (OI.shape[0] - 1)
    side = OI[i, OI_SIDE]
    otype = OI[i, OI_TYPE]
    step = CF[CF_SIZE_STEP]
    lots = OI[i, OI_LOTS]
    OI[i, OI_XFILLED] = 0
    if OI[i, OI_REDUCE] != 0 and not _reduce_only_ok(S[S_XPOS], side, lots):
        _report(S, C, OI, heap, olat, M_REJECT, oid, R_REDUCE_REJECTED, 0.0, 0.0)
        return
    _report(S, C, OI, heap, olat, M_ACK, oid, 0, 0.0, 0.0)
    tick = CF[CF_TICK]
    limit = float(OI[i, OI_PX]) if otype == LIMIT else NAN
    n, filled, S[S_XPOS], outcome = match_arrival(
        x_book, side, lots, step, limit, tick, otype == MARKET, S[S_XPOS], lpx, lq
    )
    for j in range(n):
        _report_fill(S, C, OI, heap, olat, oid, lpx[j], lq[j], LIQ_TAKER)
    if outcome != AR_REST:
        _report(S, C, OI, heap, olat, M_DONE, oid, R_FILLED if outcome == AR_FILLED else R_IOC, 0.0, 0.0)
        return
    OI[i, OI_XFILLED] = filled
    OF[r, OF_AHEAD], OF[r, OF_LEVEL], OF[r, OF_TRADED] = on_new(
        C[C_FILL_MODEL], x_book, side, OI[i, OI_PX], tick
    )
    nr = S[S_NREST]
    if nr >= rest.shape[0] >> 1:
        S[S_WHY] = U_TABLE
        return
    rest[nr] = oid
    S[S_NREST] = nr + 1
    OI[oid & (OI.shape[0] - 1), OI_RESTING] = 1


@njit
def x_arrive_cancel(S, C, OI, heap, olat, rest, a):
    """A cancel of order ``a`` reaches the venue: acknowledged if it rests, else refused (Bitget answers
    "order does not exist": already filled, unknown, or not arrived yet)."""
    if drop_id(S, S_NREST, rest, a):
        OI[a & (OI.shape[0] - 1), OI_RESTING] = 0
        _report(S, C, OI, heap, olat, M_CANCEL_ACK, a, 0, 0.0, 0.0)
    else:
        _report(S, C, OI, heap, olat, M_REJECT, a, R_CANCEL_NOT_FOUND, 0.0, 0.0)


@njit
def forward(S, C, OI, heap, olat, OUTI, NOUT):
    """Hand the orders and cancels the engine accepted since the last call (its order rows from
    S[S_SENT] on) to the simulated exchange: each arrives after its drawn latency."""
    n = NOUT[O_ORDER]
    for k in range(S[S_SENT], n):
        kind = OUTI[O_ORDER, 3, k]
        oid = OUTI[O_ORDER, 2, k]
        now = OUTI[O_ORDER, 1, k]
        if kind == OK_NEW:
            at = now + _draw(S, C, olat, OLAT_ENTRY)
            _heap_push(S, heap, OI, at, PRIO_EXCH_IN, T_ARRIVE, oid, 0, 0, 0.0, 0.0)
        elif kind == OK_CANCEL:
            at = now + _draw(S, C, olat, OLAT_CANCEL)
            _heap_push(S, heap, OI, at, PRIO_EXCH_IN, T_ARRIVE_CANCEL, oid, 0, 0, 0.0, 0.0)
    S[S_SENT] = n
