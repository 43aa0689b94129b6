"""Orders: each through the risk gateway (``_check_new``) and out (``_send_new``, ``_send_cancel``), the
working-order list, the strategy's quotes kept at its prices (``_requote``) and the market order towards
Kev's target (``leg_order``, ``_rebalance``).
"""

from __future__ import annotations

import numpy as np

from engine import risk_call
from engine.contract import NO_PX, lots_of, tick_index
from engine.jit import njit
from engine.kernel.layout import (
    C_MAX_ADVICE_AGE,
    C_MAX_ORDERS_PER_S,
    C_MAX_POS_LOTS,
    C_QUOTE_LOTS,
    C_REBALANCE_MIN,
    C_REQUOTE_MIN,
    C_RISK_FN,
    C_RISK_RULES,
    C_STALE_BOOK,
    C_STRATEGY,
    C_STRATEGY_FN,
    CF_BAND,
    CF_LOSS_STOP,
    CF_MAX_DELTA,
    CF_MAX_ORDER_QTY,
    CF_MAX_POSITION,
    CF_MAX_SLIP,
    CF_MIN_QTY,
    CF_PARAMS,
    CF_PF_LOSS_STOP,
    CF_PF_MAX_DELTA,
    CF_PF_MAX_GROSS,
    CF_QUOTE_QTY,
    CF_SIZE_STEP,
    CF_TICK,
    DONE,
    INTENT_CANCEL,
    INTENT_NEW,
    LIVE,
    NAN,
    OF_SLIP,
    OI_AGE,
    OI_FILLED,
    OI_LOTS,
    OI_OID,
    OI_PX,
    OI_REDUCE,
    OI_REFS,
    OI_RESTING,
    OI_SENT,
    OI_SIDE,
    OI_SOURCE,
    OI_STATUS,
    OI_TYPE,
    OK_CANCEL,
    OK_NEW,
    PENDING_CANCEL,
    PENDING_NEW,
    R_EMPTY,
    REF_ORDER,
    S_CASH_HI,
    S_CASH_LO,
    S_CMD,
    S_CMD_ACTION,
    S_CMD_TS_RECV,
    S_CMD_VALID_UNTIL,
    S_EMERGENCY_UNTIL,
    S_ENG_BOOK,
    S_ENG_ROW,
    S_KILL,
    S_LAST_LABEL_NAME,
    S_LAST_REBALANCE,
    S_LAST_REQUOTE,
    S_NOW,
    S_NWORK,
    S_OID,
    S_POS,
    S_RECENT_HEAD,
    S_RECENT_TAIL,
    S_WHY,
    SF_CMD_SLIP,
    SF_CMD_TARGET,
    SF_OTHERS_DELTA,
    SF_OTHERS_GROSS,
    SF_OTHERS_PNL,
    SPAN_TICK_TO_ORDER,
    U_NONE,
    U_SIZE,
    U_TABLE,
)
from engine.kernel.rows import _order_event, _risk_row, _span
from engine.kernel.units import _lots, position_words, price_of, size_of
from engine.kev.rules import A_FLATTEN
from engine.risk_codes import (
    BUY,
    LIMIT,
    MARKET,
    R_OK,
    RATE_WINDOW_NS,
    SELL,
    SRC_CANCEL,
    SRC_FLATTEN,
    SRC_KEV,
    SRC_QUOTE,
)
from engine.strategies import call
from engine.strategy import NO_ORDER, kev_target, rebalance_order


@njit
def _check_new(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    work,
    recent,
    eng_book,
    b_loc,
    side,
    otype,
    px,
    qty,
    reduce_only,
    slip,
    source,
    age,
    now,
    lpx,
    lq,
):
    """engine.risk.verdict, with the configured rules, on the engine's state for a new order (through
    the rules' entry: engine/risk_call.py); returns the reason code (R_OK when accepted)."""
    # the lots working orders have still open, by side
    buy = 0
    sell = 0
    for w in range(S[S_NWORK]):
        o = work[w] & (OI.shape[0] - 1)
        if OI[o, OI_SIDE] == BUY:
            buy += OI[o, OI_LOTS] - OI[o, OI_FILLED]
        else:
            sell += OI[o, OI_LOTS] - OI[o, OI_FILLED]
    # accepted new orders in the rate window: the ring drops the older ones (now never goes back)
    cutoff = now - RATE_WINDOW_NS
    head = S[S_RECENT_HEAD]
    tail = S[S_RECENT_TAIL]
    while head < tail and recent[head % recent.shape[0]] <= cutoff:
        head += 1
    S[S_RECENT_HEAD] = head
    has_book = S[S_ENG_BOOK] != 0
    book_ts = b_loc[S[S_ENG_ROW]] if has_book else 0
    # position and cash (integers of 1e-12) as the rules' two words each: hi * 2**32 + lo
    pos_hi, pos_lo = position_words(S, C)
    vi = (  # engine.risk_codes VI_* order
        pos_hi,
        pos_lo,
        S[S_CASH_HI],
        S[S_CASH_LO],
        S[S_POS],
        buy,
        sell,
        tail - head,
        S[S_KILL] != 0,
        side,
        otype,
        reduce_only,
        source,
        age,
        has_book,
        book_ts,
        now,
    )
    vf = (  # the limits in engine.risk_codes L_* order, then VF_*
        CF[CF_MAX_POSITION],
        CF[CF_MAX_DELTA],
        CF[CF_MAX_ORDER_QTY],
        CF[CF_MAX_SLIP],
        CF[CF_BAND],
        float(C[C_MAX_ORDERS_PER_S]),
        float(C[C_STALE_BOOK]),
        CF[CF_LOSS_STOP],
        float(C[C_MAX_ADVICE_AGE]),
        CF[CF_PF_MAX_DELTA],
        CF[CF_PF_MAX_GROSS],
        CF[CF_PF_LOSS_STOP],
        px,
        qty,
        slip,
        eng_book[0],
        eng_book[15],
        eng_book[30],
        eng_book[45],
        CF[CF_SIZE_STEP],
        CF[CF_TICK],
        SF[SF_OTHERS_DELTA],
        SF[SF_OTHERS_GROSS],
        SF[SF_OTHERS_PNL],
    )
    return risk_call.verdict(C[C_RISK_FN], vi, vf, C, C_RISK_RULES, eng_book, lpx, lq)


@njit
def _send_new(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    heap,
    olat,
    work,
    recent,
    eng_book,
    b_loc,
    side,
    otype,
    px,
    qty,
    origin,
    slip,
    reduce_only,
    source,
    age,
    out,
    lpx,
    lq,
):
    OUTI, OUTF, NOUT = out
    oid = S[S_OID] + 1
    S[S_OID] = oid
    now = S[S_NOW]
    reason = _check_new(
        S,
        SF,
        C,
        CF,
        OI,
        OF,
        work,
        recent,
        eng_book,
        b_loc,
        side,
        otype,
        px,
        qty,
        reduce_only,
        slip,
        source,
        age,
        now,
        lpx,
        lq,
    )
    if S[S_WHY] != U_NONE:
        return
    ok = reason == R_OK
    _risk_row(out, now, oid, INTENT_NEW, side, otype, source, age, ok, reason, px, qty)
    if not ok:
        return
    lots = _lots(qty, C)
    if lots < 0:  # unreachable: the gateway's well_formed passes only whole lots
        S[S_WHY] = U_SIZE
        return
    tail = S[S_RECENT_TAIL]
    if tail - S[S_RECENT_HEAD] >= recent.shape[0]:
        S[S_WHY] = U_TABLE
        return
    recent[tail % recent.shape[0]] = now
    S[S_RECENT_TAIL] = tail + 1
    OI[oid & (OI.shape[0] - 1), OI_OID] = oid
    OI[oid & (OI.shape[0] - 1), OI_REFS] = 0
    OI[oid & (OI.shape[0] - 1), OI_RESTING] = 0
    OI[oid & (OI.shape[0] - 1), OI_SIDE] = side
    OI[oid & (OI.shape[0] - 1), OI_TYPE] = otype
    OI[oid & (OI.shape[0] - 1), OI_SENT] = now
    OI[oid & (OI.shape[0] - 1), OI_STATUS] = PENDING_NEW
    OI[oid & (OI.shape[0] - 1), OI_REDUCE] = 1 if reduce_only else 0
    OI[oid & (OI.shape[0] - 1), OI_SOURCE] = source
    OI[oid & (OI.shape[0] - 1), OI_AGE] = age
    OI[oid & (OI.shape[0] - 1), OI_PX] = np.int64(tick_index(px, CF[CF_TICK])) if otype == LIMIT else NO_PX
    OI[oid & (OI.shape[0] - 1), OI_LOTS] = lots
    OI[oid & (OI.shape[0] - 1), OI_FILLED] = 0
    OF[oid & (OF.shape[0] - 1), OF_SLIP] = slip
    nw = S[S_NWORK]
    if nw >= work.shape[0] // 3:  # unreachable: _headroom grows the list first
        S[S_WHY] = U_TABLE
        return
    work[nw] = oid
    S[S_NWORK] = nw + 1
    _order_event(out, C, OI, OF, oid, OK_NEW, now, now, R_EMPTY)
    _span(OUTI, NOUT, SPAN_TICK_TO_ORDER, REF_ORDER, oid, origin, now)


@njit
def _send_cancel(S, C, OI, OF, heap, olat, oid, out):
    now = S[S_NOW]
    _risk_row(
        out,
        now,
        oid,
        INTENT_CANCEL,
        OI[oid & (OI.shape[0] - 1), OI_SIDE],
        OI[oid & (OI.shape[0] - 1), OI_TYPE],
        SRC_CANCEL,
        -1,
        True,
        R_OK,
        price_of(OI[oid & (OI.shape[0] - 1), OI_PX], C),
        size_of(OI[oid & (OI.shape[0] - 1), OI_LOTS] - OI[oid & (OI.shape[0] - 1), OI_FILLED], C),
    )
    OI[oid & (OI.shape[0] - 1), OI_STATUS] = PENDING_CANCEL
    _order_event(out, C, OI, OF, oid, OK_CANCEL, now, now, R_EMPTY)


@njit
def _cancel_all(S, C, OI, OF, heap, olat, work, out):
    n = S[S_NWORK]
    cap = work.shape[0] // 3
    snapshot = work[cap : 2 * cap]  # scratch: the list as it was (cancels do not change it)
    for w in range(n):
        snapshot[w] = work[w]
    for w in range(n):
        o = snapshot[w]
        if OI[o & (OI.shape[0] - 1), OI_TYPE] == LIMIT and (
            OI[o & (OI.shape[0] - 1), OI_STATUS] == PENDING_NEW
            or OI[o & (OI.shape[0] - 1), OI_STATUS] == LIVE
        ):
            _send_cancel(S, C, OI, OF, heap, olat, o, out)


@njit
def drop_id(S, count, ids, x):
    """Remove ``x`` from ``ids[:S[count]]``, a list kept in order (working orders, resting orders,
    Kev requests in flight); whether it was there."""
    n = S[count]
    for w in range(n):
        if ids[w] == x:
            for v in range(w, n - 1):
                ids[v] = ids[v + 1]
            S[count] = n - 1
            return True
    return False


@njit
def _finish(S, OI, work, oid):
    OI[oid & (OI.shape[0] - 1), OI_STATUS] = DONE
    drop_id(S, S_NWORK, work, oid)


@njit
def _target(S, SF, CF, now):
    flatten = S[S_CMD_ACTION] == A_FLATTEN
    m = CF[CF_MAX_POSITION]
    return kev_target(S[S_CMD] != 0, now, S[S_CMD_VALID_UNTIL], flatten, SF[SF_CMD_TARGET], m)


@njit(inline="always")
def _strategy(S, SF, C, CF, eng_book, now):
    """The configured strategy on the engine's book, in the core's units (engine.strategies): the
    quote size, position and limit in whole lots, Kev's target in lots; (bid lots, bid ticks, ask
    lots, ask ticks) back."""
    return call.quote(
        C[C_STRATEGY_FN], C[C_STRATEGY], eng_book, CF[CF_TICK], C[C_QUOTE_LOTS], S[S_LAST_LABEL_NAME],
        S[S_POS], _target(S, SF, CF, now) / CF[CF_SIZE_STEP], C[C_MAX_POS_LOTS], CF[CF_PARAMS:],
    )  # fmt: skip


@njit(inline="always")
def _quote_px(ticks, C):
    """The price of a strategy's ``ticks``; NaN (which the gateway refuses) for none the exchange
    takes: below one tick, or from 2**52 on, where prices are no longer whole ticks."""
    return price_of(ticks, C) if 1 <= ticks < 1 << 52 else NAN


@njit
def _requote(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    heap,
    olat,
    work,
    recent,
    eng_book,
    b_loc,
    origin,
    force,
    out,
    lpx,
    lq,
):
    now = S[S_NOW]
    if S[S_ENG_BOOK] == 0 or (not force and now - S[S_LAST_REQUOTE] < C[C_REQUOTE_MIN]):
        return
    S[S_LAST_REQUOTE] = now
    if now < S[S_EMERGENCY_UNTIL] or S[S_KILL] != 0:
        _cancel_all(S, C, OI, OF, heap, olat, work, out)
        return
    bid_lots, bid_t, ask_lots, ask_t = _strategy(S, SF, C, CF, eng_book, now)
    want_buy, want_sell = bid_lots > 0, ask_lots > 0
    bid_px, ask_px = _quote_px(bid_t, C), _quote_px(ask_t, C)
    if S[S_NWORK] == 0:
        if want_buy:
            _send_new(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                heap,
                olat,
                work,
                recent,
                eng_book,
                b_loc,
                BUY,
                LIMIT,
                bid_px,
                size_of(bid_lots, C),
                origin,
                NAN,
                False,
                SRC_QUOTE,
                -1,
                out,
                lpx,
                lq,
            )
            if S[S_WHY] != U_NONE:
                return
        if want_sell:
            _send_new(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                heap,
                olat,
                work,
                recent,
                eng_book,
                b_loc,
                SELL,
                LIMIT,
                ask_px,
                size_of(ask_lots, C),
                origin,
                NAN,
                False,
                SRC_QUOTE,
                -1,
                out,
                lpx,
                lq,
            )
        return
    for side in range(2):
        want = want_buy if side == BUY else want_sell
        qpx = bid_px if side == BUY else ask_px
        qt = bid_t if side == BUY else ask_t
        ql = bid_lots if side == BUY else ask_lots
        n = S[S_NWORK]
        sel = work[2 * (work.shape[0] // 3) :]  # scratch: this side's working limit orders
        m = 0
        for w in range(n):
            o = work[w]
            if OI[o & (OI.shape[0] - 1), OI_SIDE] == side and OI[o & (OI.shape[0] - 1), OI_TYPE] == LIMIT:
                sel[m] = o
                m += 1
        keep = False
        if want:
            for j in range(m):
                o = sel[j] & (OI.shape[0] - 1)
                if OI[o, OI_PX] == qt and OI[o, OI_LOTS] == ql:
                    keep = True
                    break
        for j in range(m):
            o = sel[j]
            if not keep and (
                OI[o & (OI.shape[0] - 1), OI_STATUS] == PENDING_NEW
                or OI[o & (OI.shape[0] - 1), OI_STATUS] == LIVE
            ):
                _send_cancel(S, C, OI, OF, heap, olat, o, out)
        if want and m == 0:
            _send_new(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                heap,
                olat,
                work,
                recent,
                eng_book,
                b_loc,
                side,
                LIMIT,
                qpx,
                size_of(ql, C),
                origin,
                NAN,
                False,
                SRC_QUOTE,
                -1,
                out,
                lpx,
                lq,
            )
            if S[S_WHY] != U_NONE:
                return


@njit
def leg_order(S, SF, C, CF, OI, work):
    """(side, qty) of the market order this core sends now towards Kev's target (``_rebalance``), or
    (NO_ORDER, 0.0): none while the advice is stale, the book missing, the last one too recent or a
    market order still working. A flatten sends what the quotes resting on its side leave uncovered."""
    now = S[S_NOW]
    if S[S_CMD] == 0 or now > S[S_CMD_VALID_UNTIL] or S[S_ENG_BOOK] == 0:
        return NO_ORDER, 0.0
    if now - S[S_LAST_REBALANCE] < C[C_REBALANCE_MIN]:
        return NO_ORDER, 0.0
    side, qty = rebalance_order(
        _target(S, SF, CF, now),
        S[S_POS],
        CF[CF_QUOTE_QTY],
        CF[CF_MAX_ORDER_QTY],
        CF[CF_SIZE_STEP],
        CF[CF_MIN_QTY],
    )
    if side == NO_ORDER:
        return NO_ORDER, 0.0
    same = 0  # lots resting on the order's side
    for w in range(S[S_NWORK]):
        o = work[w] & (OI.shape[0] - 1)
        if OI[o, OI_TYPE] == MARKET:
            return NO_ORDER, 0.0
        if OI[o, OI_SIDE] == side:
            same += OI[o, OI_LOTS] - OI[o, OI_FILLED]
    if S[S_CMD_ACTION] == A_FLATTEN:
        # reduce-only counts the quotes resting on its side (the gateway's reduce_only rule): flatten what
        # they leave uncovered, or wait for them (a requote or a fill) rather than be refused
        room = abs(S[S_POS]) - same
        if room < lots_of(qty, CF[CF_SIZE_STEP]):
            if room <= 0 or size_of(room, C) < CF[CF_MIN_QTY]:
                return NO_ORDER, 0.0
            qty = size_of(room, C)
    return side, qty


@njit
def _rebalance(S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, origin, out, lpx, lq):
    side, qty = leg_order(S, SF, C, CF, OI, work)
    if side == NO_ORDER:
        return
    now = S[S_NOW]
    flatten = S[S_CMD_ACTION] == A_FLATTEN
    S[S_LAST_REBALANCE] = now
    _send_new(
        S,
        SF,
        C,
        CF,
        OI,
        OF,
        heap,
        olat,
        work,
        recent,
        eng_book,
        b_loc,
        side,
        MARKET,
        NAN,
        qty,
        origin,
        SF[SF_CMD_SLIP],
        flatten,
        SRC_FLATTEN if flatten else SRC_KEV,
        now - S[S_CMD_TS_RECV],
        out,
        lpx,
        lq,
    )
