"""The replay's compiled loop: the decision core (``engine/kernel.py``) and the simulated exchange
(``venue/kernel.py``) as one state machine over the merged walk of a session.

Each walk entry (a book or trade at the exchange, a book at the engine, a label becoming visible) and
each due timer is one step; after each, the orders the engine accepted go to the simulated exchange
(``forward``), as live mode hands them to Bitget. The loop stops whenever :mod:`replay.fast_path`
must act (an output buffer is full, a table must grow, Kev lags or order latencies must be drawn, a
Kev request must be answered in Python) and resumes where it stopped.

This module also names the core's layout and codes for the loop's driver and tests.
"""

from __future__ import annotations

import numpy as np

from engine.jit import njit
from engine.kernel import *  # noqa: F403 - the core's layout and codes, under the loop's name too
from engine.kernel import (  # noqa: F401 - tests reach some of these through the loop's name
    HF_COLS,
    HI_COLS,
    OI_REFS,
    S_ENG_BOOK,
    S_ENG_ROW,
    S_HEAP_N,
    S_LABELS,
    S_NOW,
    S_NREST,
    S_WALK,
    S_WHY,
    S_XBOOK,
    ST_DONE,
    ST_UNSUPPORTED,
    T_ARRIVE,
    T_ARRIVE_CANCEL,
    T_REPORT,
    U_LOOK_AHEAD,
    U_NONE,
    _check_new,
    _engine_timer,
    _headroom,
    _heap_pop,
    _on_label,
    pyround,
)
from venue.fills import FM_QUEUE_LOG, FM_QUEUE_POWER, FM_RISK_AVERSE, FM_THROUGH, FM_TOUCH  # noqa: F401
from venue.kernel import (  # noqa: F401 - tests reach some of these through the loop's name
    _recorded,
    _x_arrive,
    _x_arrive_cancel,
    _x_on_book,
    _x_on_trade,
    forward,
)


@njit
def run(
    walk_ts,
    walk_prio,
    walk_kind,
    walk_row,
    walk_end,
    levels,
    level_row0,
    b_loc,
    labels,
    probs,
    t_px,
    t_sz,
    t_side,
    lags,
    olat,
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    HI,
    HF,
    work,
    rest,
    kq,
    inflight,
    recent,
    eng_book,
    x_book,
    OUTI,
    OUTF,
    NOUT,
    out_cap,
):
    """Run the walk from S[S_WALK] to walk_end. Returns a status (ST_*)."""
    tmpi = np.zeros(HI_COLS, dtype=np.int64)
    tmpf = np.zeros(HF_COLS, dtype=np.float64)
    lpx = np.zeros(16, dtype=np.float64)
    lq = np.zeros(16, dtype=np.float64)
    i = S[S_WALK]
    while i < walk_end:
        t = walk_ts[i]
        p = walk_prio[i]
        # timers that sort before this entry
        while S[S_HEAP_N] > 0 and (HI[0, 0] < t or (HI[0, 0] == t and HI[0, 1] < p)):
            st = _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight)
            if st != ST_DONE:
                return st
            _heap_pop(S, HI, HF, tmpi, tmpf)
            S[S_NOW] = tmpi[0]
            _timer(
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
                HI,
                HF,
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
                OUTI,
                OUTF,
                NOUT,
                lpx,
                lq,
            )
            if S[S_WHY] != U_NONE:
                return ST_UNSUPPORTED
        st = _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight)
        if st != ST_DONE:
            return st
        S[S_NOW] = t
        k = walk_kind[i]
        r = walk_row[i]
        if k == 0:  # book at the exchange
            j = r - level_row0
            for c in range(60):
                x_book[c] = levels[j, c]
            S[S_XBOOK] = 1
            _x_on_book(S, SF, C, CF, OI, OF, HI, HF, olat, rest, x_book, OUTI, OUTF, NOUT)
        elif k == 2:  # book at the engine
            j = r - level_row0
            for c in range(60):
                eng_book[c] = levels[j, c]
            S[S_ENG_ROW] = r
            S[S_ENG_BOOK] = 1
        elif k == 4:  # Laya's label of book r becomes visible
            if b_loc[r] > t:  # never read a label whose book has not arrived (no look-ahead)
                S[S_WHY] = U_LOOK_AHEAD
                return ST_UNSUPPORTED
            S[S_LABELS] += 1
            _on_label(
                r,
                labels[r],
                probs[r, labels[r]],
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                RI,
                RF,
                HI,
                HF,
                olat,
                work,
                rest,
                kq,
                inflight,
                recent,
                eng_book,
                x_book,
                b_loc,
                levels,
                level_row0,
                lags,
                OUTI,
                OUTF,
                NOUT,
                lpx,
                lq,
            )
            forward(S, C, OI, HI, HF, olat, OUTI, NOUT)
        elif k == 1:  # trade at the exchange
            if S[S_NREST] > 0:
                _x_on_trade(
                    S, SF, C, CF, OI, OF, HI, HF, olat, rest, t_px[r], t_sz[r], t_side[r], OUTI, OUTF, NOUT
                )
        # kind 3 (trade at the engine): Engine.on_trade does nothing
        if S[S_WHY] != U_NONE:
            return ST_UNSUPPORTED
        i += 1
        S[S_WALK] = i
    return ST_DONE


@njit
def run_all(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    HI,
    HF,
    work,
    rest,
    kq,
    inflight,
    recent,
    eng_book,
    x_book,
    b_loc,
    lags,
    olat,
    OUTI,
    OUTF,
    NOUT,
    out_cap,
):
    """The end of the tape: every pending timer, in order (ReplayClock.run_all)."""
    tmpi = np.zeros(HI_COLS, dtype=np.int64)
    tmpf = np.zeros(HF_COLS, dtype=np.float64)
    lpx = np.zeros(16, dtype=np.float64)
    lq = np.zeros(16, dtype=np.float64)
    while S[S_HEAP_N] > 0:
        st = _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight)
        if st != ST_DONE:
            return st
        _heap_pop(S, HI, HF, tmpi, tmpf)
        S[S_NOW] = tmpi[0]
        _timer(
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
            HI,
            HF,
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
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )
        if S[S_WHY] != U_NONE:
            return ST_UNSUPPORTED
    return ST_DONE


@njit
def _timer(
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
    HI,
    HF,
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
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    """A timer of the loop's heap: the simulated exchange's (an order or cancel arriving), else the
    engine's."""
    kind = tmpi[3]
    a = tmpi[4]
    if kind <= T_REPORT:
        OI[a & (OI.shape[0] - 1), OI_REFS] -= 1
    if kind == T_ARRIVE:
        _x_arrive(S, SF, C, CF, OI, OF, HI, HF, olat, rest, x_book, a, OUTI, OUTF, NOUT, lpx, lq)
    elif kind == T_ARRIVE_CANCEL:
        _x_arrive_cancel(S, C, OI, HI, HF, olat, rest, a)
    else:
        _engine_timer(
            tmpi, tmpf, S, SF, C, CF, OI, OF, RI, RF, HI, HF, olat, work, rest, kq, inflight, recent,
            eng_book, x_book, b_loc, lags, OUTI, OUTF, NOUT, lpx, lq,
        )  # fmt: skip
    forward(S, C, OI, HI, HF, olat, OUTI, NOUT)
