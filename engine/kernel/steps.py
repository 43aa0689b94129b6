"""The entries for a caller that owns the clock and the venue (``engine/core.py``: live mode, the
per-event replay): each ``step_*`` is one event, the same transitions the replay loop runs.
"""

from __future__ import annotations

import numpy as np

from engine.jit import njit
from engine.kernel.label import _on_label
from engine.kernel.layout import (
    CF_MAX_ORDER_QTY,
    CF_MIN_QTY,
    CF_SIZE_STEP,
    DONE,
    HF_COLS,
    LIVE,
    NAN,
    OI_FILLED,
    OI_LOTS,
    OI_OID,
    OI_SIDE,
    OI_STATUS,
    OI_TYPE,
    PENDING_NEW,
    PRIO_KEV,
    S_CMD_ACTION,
    S_CMD_TS_RECV,
    S_ENG_BOOK,
    S_KILL,
    S_LABELS,
    S_NOW,
    S_NWORK,
    S_OID,
    S_POS,
    SF_CMD_SLIP,
)
from engine.kernel.orders import (
    _cancel_all,
    _check_new,
    _quote_px,
    _rebalance,
    _send_cancel,
    _send_new,
    _strategy,
)
from engine.kernel.report import _engine_report
from engine.kernel.timers import _apply_command, _engine_timer
from engine.kernel.units import size_of
from engine.kev.rules import A_FLATTEN
from engine.risk_codes import BUY, LIMIT, MARKET, SELL, SRC_FLATTEN, SRC_KEV, SRC_QUOTE, lots_within

# ---------------------------------------------------------------- one event at a time
# The entries for a caller that owns the clock and the venue (engine/core.py): each is one event at
# S[S_NOW]; the caller checks headroom() first, then reads the rows the step wrote (orders to hand to
# the venue, Kev requests to ask) and S[S_WHY].


SCRATCH_F = 32 + HF_COLS  # a step's float scratch (CoreState.SCR): two walks' levels, a timer's floats


@njit(inline="always")
def _scratch_f(SCR):
    """A step's float scratch, zeroed: the levels a walk reads (lpx, lq) and a timer's floats."""
    SCR[:] = 0.0
    return SCR[0:16], SCR[16:32], SCR[32:SCRATCH_F]


@njit
def step_label(
    label_id, p_label, S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight, recent,
    eng_book, x_book, b_loc, levels, lags, out, SCR,
):  # fmt: skip
    """Laya's label of the book in ``levels[0]`` (received at ``b_loc[0]``) becomes visible."""
    lpx, lq, _ = _scratch_f(SCR)
    S[S_LABELS] += 1
    _on_label(
        0, label_id, p_label, S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight, recent,
        eng_book, x_book, b_loc, levels, 0, lags, out, lpx, lq,
    )  # fmt: skip


@njit
def step_report(
    m, oid, arg, px, qty, ts_event, S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc,
    out, SCR,
):  # fmt: skip
    """The venue's report ``m`` (M_*) on order ``oid``: ``arg`` a reject or done reason (R_*) or a
    fill's liquidity (LIQ_*), ``px``/``qty`` a fill's."""
    lpx, lq, tmpf = _scratch_f(SCR)
    tmpf[0] = px
    tmpf[1] = qty
    _engine_report(
        S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, m, oid, arg, tmpf, ts_event,
        out, lpx, lq,
    )  # fmt: skip


@njit
def step_timer(
    kind, a, b, S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight, recent, eng_book,
    x_book, b_loc, lags, out, SCR, SCRI,
):  # fmt: skip
    """A Kev timer: T_KEV_TIMEOUT of request ``a`` started at ``b``, or T_KEV_DONE, its reply (the
    verdict in its row) after lag ``b``. ``SCRI``: HI_COLS int64 of scratch."""
    lpx, lq, tmpf = _scratch_f(SCR)
    tmpi = SCRI
    tmpi[:] = 0
    tmpi[0] = S[S_NOW]
    tmpi[1] = PRIO_KEV
    tmpi[3] = kind
    tmpi[4] = a
    tmpi[5] = b
    _engine_timer(
        tmpi, tmpf, S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight, recent, eng_book,
        x_book, b_loc, lags, out, lpx, lq,
    )  # fmt: skip


@njit
def step_command(
    cid, rid, ts_ctx, action, target, hedge, slip, S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book,
    b_loc, out, SCR,
):  # fmt: skip
    """Kev's portfolio command ``cid``, answering request ``rid`` of another instrument, sets this one's
    target (``action`` A_*, ``target``, ``hedge``: its pair's hedge ratio, ``slip``): the advice is this
    instrument's from now on, as if its own request had brought it, and it rebalances towards it."""
    lpx, lq, _ = _scratch_f(SCR)
    _apply_command(S, SF, C, out, cid, rid, ts_ctx, action, target, hedge, slip)
    _rebalance(S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, ts_ctx, out, lpx, lq)


@njit
def step_command_part(
    cid, rid, ts_ctx, action, target, hedge, slip, S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book,
    b_loc, out, SCR,
):  # fmt: skip
    """Kev's portfolio command ``cid``: this instrument's part of it becomes its advice, without the
    order towards it: a hub's unit (engine/legs.py) sends every leg once every part is applied."""
    _apply_command(S, SF, C, out, cid, rid, ts_ctx, action, target, hedge, slip)


@njit
def step_rebalance(
    origin, S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, out, SCR
):  # fmt: skip
    """This instrument's leg of a hub's unit: the market order towards its target (``leg_order``),
    through the risk gateway; ``origin``: when the command's context was taken."""
    lpx, lq, _ = _scratch_f(SCR)
    _rebalance(S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, origin, out, lpx, lq)


@njit
def step_hedge(
    side, lots, cross, cancel_oid, S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, out, SCR,
):  # fmt: skip
    """A legging residual of ``lots`` on this instrument is hedged now (engine/legs.py): a market order
    (``cross``), else a limit order at the far touch (the price that fills now, the rest resting there
    until the next check reprices it); ``cancel_oid`` (> 0): the previous hedge, cancelled first if it
    still works. Judged by the risk gateway as an order on Kev's command (a flatten's: reduce-only,
    source flatten, which the kill switch lets through). Returns the order's id."""
    lpx, lq, _ = _scratch_f(SCR)
    mask = OI.shape[0] - 1
    if cancel_oid > 0 and OI[cancel_oid & mask, OI_OID] == cancel_oid:
        st = OI[cancel_oid & mask, OI_STATUS]
        if OI[cancel_oid & mask, OI_TYPE] == LIMIT and (st == PENDING_NEW or st == LIVE):
            _send_cancel(S, C, OI, OF, heap, olat, cancel_oid, out)
    now = S[S_NOW]
    qty = size_of(lots, C)
    otype = MARKET
    px = NAN
    if not cross:
        otype = LIMIT
        px = eng_book[30] if side == BUY else eng_book[0]
    oid = S[S_OID] + 1
    flatten = S[S_CMD_ACTION] == A_FLATTEN  # a flatten's residual: reduce-only, as its legs were
    _send_new(
        S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, side, otype, px, qty, now,
        SF[SF_CMD_SLIP], flatten, SRC_FLATTEN if flatten else SRC_KEV, now - S[S_CMD_TS_RECV], out, lpx, lq,
    )  # fmt: skip
    return oid


@njit
def order_fill(OI, oid):
    """(lots filled, whether the order is done) of order ``oid`` as the engine knows it; (-1, True)
    when its row already serves another order."""
    r = oid & (OI.shape[0] - 1)
    if OI[r, OI_OID] != oid:
        return -1, True
    return OI[r, OI_FILLED], OI[r, OI_STATUS] == DONE


@njit
def step_kill(S, C, OI, OF, heap, olat, work, out):
    """The kill switch: no new orders from now on (the risk gateway's first rule); working limit
    orders are cancelled."""
    S[S_KILL] = 1
    _cancel_all(S, C, OI, OF, heap, olat, work, out)


@njit
def step_flatten(S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, out, SCR):
    """Reduce-only market orders (source flatten, ``max_order_qty`` at most each) for the part of the
    position that working market orders on the closing side do not cover yet. They pass the risk
    gateway like any order; the kill switch lets exactly these through (they can only shrink the
    position). Returns (orders sent, whether one was refused: the caller may try again later). The
    caller leaves room for 100 orders in the working list first."""
    lpx, lq, _ = _scratch_f(SCR)
    mask = OI.shape[0] - 1
    side = SELL if S[S_POS] > 0 else BUY
    covered = 0  # lots
    for w in range(S[S_NWORK]):
        o = work[w] & mask
        if OI[o, OI_TYPE] == MARKET and OI[o, OI_SIDE] == side:
            covered += OI[o, OI_LOTS] - OI[o, OI_FILLED]
    left = abs(S[S_POS]) - covered  # lots, counted down exactly (a float size would drift)
    cap = lots_within(CF[CF_MAX_ORDER_QTY], CF[CF_SIZE_STEP])
    now = S[S_NOW]
    sent = 0
    while sent < 100:
        lots = left if cap >= left else np.int64(cap)
        qty = size_of(lots, C)
        if lots <= 0 or qty < CF[CF_MIN_QTY]:
            return sent, False
        oid = S[S_OID] + 1
        _send_new(
            S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, side, MARKET, NAN, qty, now,
            NAN, True, SRC_FLATTEN, -1, out, lpx, lq,
        )  # fmt: skip
        if OI[oid & mask, OI_OID] != oid or OI[oid & mask, OI_STATUS] != PENDING_NEW:
            return sent, True
        sent += 1
        left -= lots
    return sent, False


@njit
def step_warm(S, SF, C, CF, OI, OF, work, recent, eng_book, b_loc, SCR):
    """The order decision path (the strategy, the risk rules) on the current book, results discarded,
    so the next decision finds its code and data in the CPU caches (live mode runs it between frames).
    It changes nothing a decision reads: the rate window drops only order times that the next risk
    check drops anyway. Returns how many risk checks it ran."""
    if S[S_ENG_BOOK] == 0:
        return 0
    lpx, lq, _ = _scratch_f(SCR)
    now = S[S_NOW]
    bid_lots, bid_t, ask_lots, ask_t = _strategy(S, SF, C, CF, eng_book, now)
    checks = 0
    for side in range(2):
        lots = bid_lots if side == BUY else ask_lots
        if lots > 0:
            px = _quote_px(bid_t if side == BUY else ask_t, C)
            _check_new(
                S, SF, C, CF, OI, OF, work, recent, eng_book, b_loc, side, LIMIT, px, size_of(lots, C),
                False, NAN, SRC_QUOTE, -1, now, lpx, lq,
            )  # fmt: skip
            checks += 1
    return checks
