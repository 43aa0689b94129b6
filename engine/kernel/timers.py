"""The engine's timers (``_engine_timer``): a venue report reaching it, a Kev request's timeout or reply,
and a reply becoming the engine's command (``_apply_command``).
"""

from __future__ import annotations

from engine.jit import njit
from engine.kernel.kev import _inflight_pop, _kev_pump
from engine.kernel.layout import (
    C_KEV_TTL,
    O_COMMAND,
    O_KEV_RESPONSE,
    REF_KEV,
    RF_HEDGE,
    RF_SLIP,
    RF_TARGET,
    RI_ACTION,
    RI_OK,
    RI_TS,
    S_CMD,
    S_CMD_ACTION,
    S_CMD_ID,
    S_CMD_TS_RECV,
    S_CMD_VALID_UNTIL,
    S_KQ_N,
    S_NOW,
    S_UNIT,
    S_WHY,
    SF_CMD_HEDGE,
    SF_CMD_SLIP,
    SF_CMD_TARGET,
    SPAN_KEV,
    T_KEV_DONE,
    T_KEV_TIMEOUT,
    T_REPORT,
    U_NONE,
)
from engine.kernel.orders import _rebalance
from engine.kernel.report import _engine_report
from engine.kernel.rows import _queue_note, _span
from engine.kev.queue import Q_LATE, Q_TIMEOUT


@njit
def _engine_timer(
    tmpi,
    tmpf,
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    heap,
    olat,
    work,
    rest,
    kq,
    inflight,
    recent,
    eng_book,
    x_book,
    b_loc,
    lags,
    out,
    lpx,
    lq,
):
    """The engine's timers: an exchange report reaching it (T_REPORT), a Kev request's timeout and
    its reply (T_KEV_TIMEOUT, T_KEV_DONE)."""
    OUTI, OUTF, NOUT = out
    kind = tmpi[3]
    a = tmpi[4]
    b = tmpi[5]
    now = S[S_NOW]
    if kind == T_REPORT:
        _engine_report(
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
            b & 0xFF,
            a,
            b >> 8,
            tmpf,
            tmpi[6],
            out,
            lpx,
            lq,
        )
    elif kind == T_KEV_TIMEOUT:
        if _inflight_pop(S, inflight, a):
            _queue_note(OUTI, NOUT, now, a, Q_TIMEOUT, S[S_KQ_N])
            k = NOUT[O_KEV_RESPONSE]
            NOUT[O_KEV_RESPONSE] = k + 1
            OUTI[O_KEV_RESPONSE, 0, k] = now
            OUTI[O_KEV_RESPONSE, 1, k] = a
            OUTI[O_KEV_RESPONSE, 2, k] = 0
            OUTI[O_KEV_RESPONSE, 3, k] = now - b
            OUTI[O_KEV_RESPONSE, 4, k] = 1
            _kev_pump(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                RI,
                RF,
                heap,
                work,
                recent,
                eng_book,
                b_loc,
                kq,
                inflight,
                lags,
                out,
                lpx,
                lq,
            )
    elif kind == T_KEV_DONE:
        if not _inflight_pop(S, inflight, a):
            _queue_note(OUTI, NOUT, now, a, Q_LATE, S[S_KQ_N])
            return
        ok = RI[a & (RI.shape[0] - 1), RI_OK]
        k = NOUT[O_KEV_RESPONSE]
        NOUT[O_KEV_RESPONSE] = k + 1
        OUTI[O_KEV_RESPONSE, 0, k] = now
        OUTI[O_KEV_RESPONSE, 1, k] = a
        OUTI[O_KEV_RESPONSE, 2, k] = ok
        OUTI[O_KEV_RESPONSE, 3, k] = b
        OUTI[O_KEV_RESPONSE, 4, k] = 0
        _span(OUTI, NOUT, SPAN_KEV, REF_KEV, a, now - b, now)
        if ok != 1:  # a reply that is no valid command: the engine notes it and moves on
            _kev_pump(
                S, SF, C, CF, OI, OF, RI, RF, heap, work, recent, eng_book, b_loc, kq, inflight, lags, out,
                lpx, lq,
            )  # fmt: skip
            return
        cid = S[S_CMD_ID] + 1
        S[S_CMD_ID] = cid
        r = a & (RI.shape[0] - 1)
        ts_ctx = RI[r, RI_TS]
        _apply_command(
            S, SF, C, out, cid, a, ts_ctx, RI[r, RI_ACTION], RF[r, RF_TARGET], RF[r, RF_HEDGE],
            RF[r, RF_SLIP],
        )  # fmt: skip
        if S[S_UNIT] == 0:  # a hub's unit sends every leg together, after every part is applied
            _rebalance(
                S, SF, C, CF, OI, OF, heap, olat, work, recent, eng_book, b_loc, ts_ctx, out,
                lpx, lq,
            )  # fmt: skip
        if S[S_WHY] != U_NONE:
            return
        _kev_pump(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            RI,
            RF,
            heap,
            work,
            recent,
            eng_book,
            b_loc,
            kq,
            inflight,
            lags,
            out,
            lpx,
            lq,
        )


@njit
def _apply_command(S, SF, C, out, cid, rid, ts_ctx, action, target, hedge, slip):
    """Kev's command ``cid`` (the reply to request ``rid``, asked at ``ts_ctx``) becomes the engine's
    advice now, valid for the advice TTL, and a row of the command stream."""
    OUTI, OUTF, NOUT = out
    now = S[S_NOW]
    k = NOUT[O_COMMAND]
    NOUT[O_COMMAND] = k + 1
    valid_until = now + C[C_KEV_TTL]
    OUTI[O_COMMAND, 0, k] = ts_ctx
    OUTI[O_COMMAND, 1, k] = now
    OUTI[O_COMMAND, 2, k] = cid
    OUTI[O_COMMAND, 3, k] = rid
    OUTI[O_COMMAND, 4, k] = action
    OUTI[O_COMMAND, 5, k] = valid_until
    OUTF[O_COMMAND, 0, k] = target
    OUTF[O_COMMAND, 1, k] = hedge
    OUTF[O_COMMAND, 2, k] = slip
    S[S_CMD] = 1
    S[S_CMD_ACTION] = action
    S[S_CMD_TS_RECV] = now
    S[S_CMD_VALID_UNTIL] = valid_until
    SF[SF_CMD_TARGET] = target
    SF[SF_CMD_SLIP] = slip
    SF[SF_CMD_HEDGE] = hedge
