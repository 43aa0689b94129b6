"""The venue's reports reaching the engine (``_engine_report``: acks, rejects, cancels, fills) and a fill's
bookkeeping (``_on_fill``: the position, cash and fees in their integer units).
"""

from __future__ import annotations

import numpy as np

from engine.exact import div_half_even, mul_div_half_even
from engine.jit import njit
from engine.kernel.layout import (
    C_MAKER_EXP,
    C_MAKER_NUM,
    C_PX_DECIMALS,
    C_STEP_DEC,
    C_STEP_NUM,
    C_TAKER_EXP,
    C_TAKER_NUM,
    LIQ_MAKER,
    LIVE,
    M_ACK,
    M_CANCEL_ACK,
    M_DONE,
    M_REJECT,
    O_FILL,
    OI_FILLED,
    OI_SENT,
    OI_SIDE,
    OI_STATUS,
    OK_ACK,
    OK_CANCEL_ACK,
    OK_DONE,
    OK_REJECT,
    PENDING_NEW,
    R_EMPTY,
    REF_ORDER,
    S_CASH_HI,
    S_CASH_LO,
    S_FEES_HI,
    S_FEES_LO,
    S_NOW,
    S_POS,
    S_WHY,
    SPAN_ORDER_ENTRY,
    U_OVERFLOW,
    U_PX_DECIMALS,
    U_SIZE,
)
from engine.kernel.orders import _finish, _requote
from engine.kernel.rows import _order_event, _span
from engine.kernel.units import _add_words, _lots, _px_units, position
from engine.risk_codes import BUY


@njit
def _engine_report(
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
    m,
    oid,
    arg,
    tmpf,
    ts_event,
    out,
    lpx,
    lq,
):
    OUTI, OUTF, NOUT = out
    now = S[S_NOW]
    if m == M_ACK:
        if OI[oid & (OI.shape[0] - 1), OI_STATUS] == PENDING_NEW:
            OI[oid & (OI.shape[0] - 1), OI_STATUS] = LIVE
        _order_event(out, C, OI, OF, oid, OK_ACK, ts_event, now, R_EMPTY)
        _span(OUTI, NOUT, SPAN_ORDER_ENTRY, REF_ORDER, oid, OI[oid & (OI.shape[0] - 1), OI_SENT], now)
    elif m == M_REJECT:
        _finish(S, OI, work, oid)
        _order_event(out, C, OI, OF, oid, OK_REJECT, ts_event, now, arg)
    elif m == M_CANCEL_ACK:
        _finish(S, OI, work, oid)
        _order_event(out, C, OI, OF, oid, OK_CANCEL_ACK, ts_event, now, R_EMPTY)
        _requote(
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
            now,
            True,
            out,
            lpx,
            lq,
        )
    elif m == M_DONE:
        _finish(S, OI, work, oid)
        _order_event(out, C, OI, OF, oid, OK_DONE, ts_event, now, arg)
    else:  # M_FILL: px, qty in tmpf, liquidity in arg
        _on_fill(S, C, OI, OF, oid, tmpf[0], tmpf[1], arg, ts_event, now, out)


@njit
def _on_fill(S, C, OI, OF, oid, px, qty, liq, ts_event, now, out):
    OUTI, OUTF, NOUT = out
    side = OI[oid & (OI.shape[0] - 1), OI_SIDE]
    pu = _px_units(px, C[C_PX_DECIMALS])
    lots = _lots(qty, C)
    if pu == -(1 << 62):
        S[S_WHY] = U_PX_DECIMALS
        return
    if lots < 0:
        S[S_WHY] = U_SIZE
        return
    # price x size exactly, pu x lots x C_STEP_NUM in 10**-(price decimals + step decimals) USDT, then
    # in the integers of 1e-12 USDT that money is kept in (half-even past 12 decimals)
    e = 12 - C[C_PX_DECIMALS] - C[C_STEP_DEC]
    scale = np.int64(10) ** abs(e)
    if lots > (1 << 62) // max(abs(pu), 1) // C[C_STEP_NUM] // (scale if e > 0 else 1):
        S[S_WHY] = U_OVERFLOW
        return
    x = pu * lots * C[C_STEP_NUM]
    notional = x * scale if e >= 0 else div_half_even(x, scale)
    num = C[C_MAKER_NUM] if liq == LIQ_MAKER else C[C_TAKER_NUM]
    ex = C[C_MAKER_EXP] if liq == LIQ_MAKER else C[C_TAKER_EXP]
    fee = mul_div_half_even(notional, num, np.int64(10) ** ex)  # |rate| < 1: no overflow
    if side == BUY:
        S[S_POS] += lots
        _add_words(S, S_CASH_HI, S_CASH_LO, -notional)
    else:
        S[S_POS] -= lots
        _add_words(S, S_CASH_HI, S_CASH_LO, notional)
    _add_words(S, S_CASH_HI, S_CASH_LO, -fee)
    _add_words(S, S_FEES_HI, S_FEES_LO, fee)
    # the risk rules read high words up to 2**53; position_words needs |lots x C_STEP_NUM| < 2**52
    if max(abs(S[S_CASH_HI]), abs(S[S_FEES_HI])) > 1 << 53 or abs(S[S_POS]) > (1 << 52) // C[C_STEP_NUM]:
        S[S_WHY] = U_OVERFLOW
        return
    OI[oid & (OI.shape[0] - 1), OI_FILLED] += lots
    k = NOUT[O_FILL]
    NOUT[O_FILL] = k + 1
    OUTI[O_FILL, 0, k] = ts_event
    OUTI[O_FILL, 1, k] = now
    OUTI[O_FILL, 2, k] = oid
    OUTI[O_FILL, 3, k] = side
    OUTI[O_FILL, 4, k] = liq
    OUTI[O_FILL, 5, k] = notional
    OUTI[O_FILL, 6, k] = fee
    OUTF[O_FILL, 0, k] = px
    OUTF[O_FILL, 1, k] = qty
    OUTF[O_FILL, 2, k] = position(S, C)
