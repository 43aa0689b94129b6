"""Kev's request flow: a label offered as a request to the queue (its policy: ``engine/kev/queue.py``),
started when an in-flight slot is free, decided by the compiled rule advisor or left to Python
(C_KEV_ASK), its reply or timeout put on the timer heap.
"""

from __future__ import annotations

from engine.book import imbalance_levels
from engine.contract import round_exact
from engine.jit import njit
from engine.kernel.heap import _heap_insert, _heap_push
from engine.kernel.layout import (
    C_EXTERNAL,
    C_KEV_ASK,
    C_KEV_MAX_IN_FLIGHT,
    C_KEV_POLICY,
    C_KEV_QUEUE_MAX,
    C_KEV_STALE,
    C_KEV_TIMEOUT,
    CF_MAX_POSITION,
    CF_MIN_PROB,
    CF_STEP_FRACTION,
    O_KEV_REQUEST,
    PRIO_KEV,
    REF_KEV,
    RF_HEDGE,
    RF_IMB,
    RF_MAXPOS,
    RF_MID,
    RF_P,
    RF_POS,
    RF_SLIP,
    RF_SPREAD,
    RF_TARGET,
    RI_ACTION,
    RI_DONE_SEQ,
    RI_LABEL,
    RI_LABEL_SEQ,
    RI_OK,
    RI_STARTED,
    RI_TS,
    RI_WHY,
    S_HEAP_SEQ,
    S_INFLIGHT_N,
    S_KEV_ASKED,
    S_KQ_N,
    S_LABELS,
    S_LAG_USED,
    S_LAST_KEV_OFFER,
    S_NOW,
    S_RID,
    S_WHY,
    SPAN_KEV_QUEUE,
    T_KEV_DONE,
    T_KEV_TIMEOUT,
    U_TABLE,
)
from engine.kernel.orders import drop_id
from engine.kernel.rows import _queue_note, _span
from engine.kernel.units import position
from engine.kev.command import TARGET_POSITION_ABS_MAX, within
from engine.kev.queue import Q_ENQUEUED, Q_STALE, is_stale, offer_plan
from engine.kev.rules import rule_decide


@njit
def _offer_kev(
    r,
    label_id,
    p_label,
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
    levels,
    level_row0,
    kq,
    inflight,
    lags,
    out,
    lpx,
    lq,
):
    OUTI, OUTF, NOUT = out
    now = S[S_NOW]
    S[S_LAST_KEV_OFFER] = now
    rid = S[S_RID] + 1
    S[S_RID] = rid
    # the labelled book's levels (the tape row r)
    j = r - level_row0
    bid0 = levels[j, 0]
    ask0 = levels[j, 30]
    mid = (bid0 + ask0) / 2.0
    spread = round_exact(ask0 - bid0, 10)
    imb = round_exact(imbalance_levels(levels[j]), 6)
    p = round_exact(p_label, 6)
    RI[rid & (RI.shape[0] - 1), RI_TS] = now
    RI[rid & (RI.shape[0] - 1), RI_LABEL] = label_id
    RI[rid & (RI.shape[0] - 1), RI_LABEL_SEQ] = S[S_LABELS] - 1
    RF[rid & (RF.shape[0] - 1), RF_P] = p
    RF[rid & (RF.shape[0] - 1), RF_MID] = mid
    RF[rid & (RF.shape[0] - 1), RF_SPREAD] = spread
    RF[rid & (RF.shape[0] - 1), RF_IMB] = imb
    RF[rid & (RF.shape[0] - 1), RF_POS] = position(S, C)
    RF[rid & (RF.shape[0] - 1), RF_MAXPOS] = CF[CF_MAX_POSITION]
    # KevQueue.offer
    n = S[S_KQ_N]
    drop, kind, enqueue = offer_plan(C[C_KEV_POLICY], n, C[C_KEV_QUEUE_MAX])
    for _ in range(drop):
        old = kq[0]
        for v in range(n - 1):
            kq[v] = kq[v + 1]
        n -= 1
        _queue_note(OUTI, NOUT, now, old, kind, n)
    if not enqueue:
        _queue_note(OUTI, NOUT, now, rid, kind, n)
        S[S_KQ_N] = n
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
        return
    if n >= kq.shape[0]:  # unreachable: the table holds the configured queue
        S[S_WHY] = U_TABLE
        return
    kq[n] = rid
    n += 1
    S[S_KQ_N] = n
    _queue_note(OUTI, NOUT, now, rid, Q_ENQUEUED, n)
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
def _kev_pump(
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
):
    while S[S_INFLIGHT_N] < C[C_KEV_MAX_IN_FLIGHT]:
        if not _kev_start_next(S, SF, C, CF, OI, RI, RF, heap, kq, inflight, lags, out):
            break


@njit
def _kev_start_next(S, SF, C, CF, OI, RI, RF, heap, kq, inflight, lags, out):
    OUTI, OUTF, NOUT = out
    now = S[S_NOW]
    n = S[S_KQ_N]
    rid = -1
    while n > 0:  # KevQueue.take
        c = kq[0]
        for v in range(n - 1):
            kq[v] = kq[v + 1]
        n -= 1
        if is_stale(now, RI[c & (RI.shape[0] - 1), RI_TS], C[C_KEV_STALE]):
            _queue_note(OUTI, NOUT, now, c, Q_STALE, n)
            continue
        rid = c
        break
    S[S_KQ_N] = n
    if rid < 0:
        return False
    m = S[S_INFLIGHT_N]
    if m >= inflight.shape[0]:  # unreachable: the table holds the configured requests in flight
        S[S_WHY] = U_TABLE
        return False
    inflight[m] = rid
    S[S_INFLIGHT_N] = m + 1
    k = NOUT[O_KEV_REQUEST]
    NOUT[O_KEV_REQUEST] = k + 1
    ts = RI[rid & (RI.shape[0] - 1), RI_TS]
    OUTI[O_KEV_REQUEST, 0, k] = ts
    OUTI[O_KEV_REQUEST, 1, k] = now
    OUTI[O_KEV_REQUEST, 2, k] = rid
    OUTI[O_KEV_REQUEST, 3, k] = RI[rid & (RI.shape[0] - 1), RI_LABEL]
    OUTI[O_KEV_REQUEST, 4, k] = RI[rid & (RI.shape[0] - 1), RI_LABEL_SEQ]
    OUTI[O_KEV_REQUEST, 5, k] = now - ts
    OUTF[O_KEV_REQUEST, 0, k] = RF[rid & (RF.shape[0] - 1), RF_MID]
    OUTF[O_KEV_REQUEST, 1, k] = RF[rid & (RF.shape[0] - 1), RF_SPREAD]
    OUTF[O_KEV_REQUEST, 2, k] = RF[rid & (RF.shape[0] - 1), RF_IMB]
    OUTF[O_KEV_REQUEST, 3, k] = RF[rid & (RF.shape[0] - 1), RF_POS]
    _span(OUTI, NOUT, SPAN_KEV_QUEUE, REF_KEV, rid, ts, now)
    if C[C_EXTERNAL] == 0:
        _heap_push(S, heap, OI, now + C[C_KEV_TIMEOUT], PRIO_KEV, T_KEV_TIMEOUT, rid, now, 0, 0.0, 0.0)
    RI[rid & (RI.shape[0] - 1), RI_STARTED] = now
    if C[C_KEV_ASK] != 0:
        # SimKevBackend.start asks the advisor now and schedules its reply: the run stops after this
        # step (ST_NEED_KEV), Python answers and kev_replied() schedules the reply under the seq taken
        # here, so it sorts among equal timers where the engine's would.
        RI[rid & (RI.shape[0] - 1), RI_OK] = -1
        RI[rid & (RI.shape[0] - 1), RI_DONE_SEQ] = S[S_HEAP_SEQ]
        S[S_HEAP_SEQ] += 1
        S[S_KEV_ASKED] += 1
        return True
    # SimKevBackend.start: RuleKev decides now; the reply is due after a lag drawn now
    RI[rid & (RI.shape[0] - 1), RI_OK] = _rule_kev(RI, RF, CF, rid)
    lag = lags[S[S_LAG_USED]]
    S[S_LAG_USED] += 1
    _heap_push(S, heap, OI, now + lag, PRIO_KEV, T_KEV_DONE, rid, lag, 0, 0.0, 0.0)
    return True


@njit
def _rule_kev(RI, RF, CF, rid):
    """RuleKev's decision on request ``rid``'s context, into its row (fast_path writes the texts); 1 if
    it is a valid command, 0 if the schema refuses it (a target beyond the command's own bound: an
    instrument whose limits are scaled to its notional holds more than 10 units)."""
    i = rid & (RI.shape[0] - 1)
    action, target, hedge, slip, why = rule_decide(
        RI[i, RI_LABEL],
        RF[i, RF_P],
        RF[i, RF_MID],
        RF[i, RF_SPREAD],
        RF[i, RF_IMB],
        RF[i, RF_POS],
        RF[i, RF_MAXPOS],
        CF[CF_STEP_FRACTION],
        CF[CF_MIN_PROB],
    )
    RI[i, RI_ACTION] = action
    RI[i, RI_WHY] = why
    RF[i, RF_TARGET] = target
    RF[i, RF_HEDGE] = hedge
    RF[i, RF_SLIP] = slip
    # the one bound the rule's numbers can break (hedge is 0 or 1, slippage 1 to 10 bps)
    return 1 if within(target, -TARGET_POSITION_ABS_MAX, TARGET_POSITION_ABS_MAX) else 0


@njit
def kev_replied(S, heap, OI, RI, rid, lag):
    """Request ``rid``'s reply (its verdict written in its row by fast_path) is due ``lag`` after it
    started."""
    i = rid & (RI.shape[0] - 1)
    due, seq = RI[i, RI_STARTED] + lag, RI[i, RI_DONE_SEQ]
    _heap_insert(S, heap, OI, due, PRIO_KEV, seq, T_KEV_DONE, rid, lag, 0, 0.0, 0.0)
    S[S_KEV_ASKED] -= 1


@njit
def _inflight_pop(S, inflight, rid):
    return drop_id(S, S_INFLIGHT_N, inflight, rid)
