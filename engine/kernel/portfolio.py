"""Several instruments as one engine: the id counters and risk view the cores share around each step
(``pf_enter``, ``pf_leave``), a hub command's legs, and what a hub's Kev reads (pair fits, labels).
"""

from __future__ import annotations

import math

import numpy as np

from engine.contract import lots_of
from engine.jit import njit
from engine.kernel.layout import (
    C_EMERGENCY_HOLD,
    CF_SIZE_STEP,
    S_CASH_HI,
    S_CASH_LO,
    S_CMD_ID,
    S_EMERGENCY_UNTIL,
    S_ENG_BOOK,
    S_HEAP_SEQ,
    S_LAG_USED,
    S_NOW,
    S_OID,
    S_RID,
    SF_OTHERS_DELTA,
    SF_OTHERS_GROSS,
    SF_OTHERS_PNL,
)
from engine.kernel.orders import _cancel_all, leg_order
from engine.kernel.units import position, usdt
from engine.kev.pairs import pair_update
from engine.risk_codes import BUY
from engine.strategy import NO_ORDER

# ---------------------------------------------------------------- several instruments, one portfolio
# A portfolio engine (engine/instruments.py) keeps one core per instrument. What they share lives in
# two small arrays: PI (int64) the id counters, so order, request and command ids are unique across the
# portfolio, and PF (float64, a row per instrument) each instrument's money as the others' risk rules
# read it. Around every step of instrument i: pf_enter, the step, pf_leave. The timer seq and the Kev
# lags used are shared too: one clock orders every instrument's timers, one Kev draws their lags in the
# order they ask. PI_WALK and PI_CUR are the replay loop's (its place in the walk, the instrument of a
# stop). PI_HUB: Kev answers for the whole portfolio; PI_FAN: the request (+1) whose reply to the
# instrument PI_CUR has just become a command of the hub, which the other instruments take next.
PI_OID, PI_RID, PI_CMD_ID, PI_SEQ, PI_LAG_USED, PI_WALK, PI_CUR, PI_HUB, PI_FAN = 0, 1, 2, 3, 4, 5, 6, 7, 8
# PI_LEG_DUE: when a hub command's legs are checked for legging (engine/legs.py; 0: no check pending),
# a timer of priority PRIO_LEG on the one clock
PI_LEG_DUE = 9
PI_SIZE = 10
PRIO_LEG = 55  # no other timer or input has it: the leg check never ties with one
# PF_LEG: while a hub command's legs go out (engine/legs.py), the USD notional each instrument's leg adds:
# the portfolio rules judge each leg against the others after theirs, the portfolio after the command
PF_MARK, PF_DELTA, PF_GROSS, PF_PNL, PF_LEG = 0, 1, 2, 3, 4
PF_COLS = 5


@njit
def pf_enter(PI, PF, i, S, SF):
    """Before a step of instrument ``i``: the portfolio's id counters, and the rest of the portfolio
    (every other instrument, summed in instrument order) as its risk rules read it."""
    S[S_OID] = PI[PI_OID]
    S[S_RID] = PI[PI_RID]
    S[S_CMD_ID] = PI[PI_CMD_ID]
    S[S_HEAP_SEQ] = PI[PI_SEQ]
    S[S_LAG_USED] = PI[PI_LAG_USED]
    d = 0.0
    g = 0.0
    p = 0.0
    for j in range(PF.shape[0]):
        if j != i:
            leg = PF[j, PF_LEG]
            if leg == 0.0:
                d += PF[j, PF_DELTA]
                g += PF[j, PF_GROSS]
            else:  # its leg of the command going out: the others judged against it after its leg
                d += PF[j, PF_DELTA] + leg
                g += abs(PF[j, PF_DELTA] + leg)
            p += PF[j, PF_PNL]
    SF[SF_OTHERS_DELTA] = d
    SF[SF_OTHERS_GROSS] = g
    SF[SF_OTHERS_PNL] = p


@njit
def pf_leg(PF, i, S, SF, C, CF, OI, work):
    """Instrument ``i``'s leg of a hub's unit (engine/legs.py): the order ``leg_order`` sends now, as
    (side, lots), its USD notional at the mark in PF[i, PF_LEG] (0 without one, or no mark)."""
    side, qty = leg_order(S, SF, C, CF, OI, work)
    PF[i, PF_LEG] = 0.0
    if side == NO_ORDER:
        return NO_ORDER, 0
    lots = lots_of(qty, CF[CF_SIZE_STEP])
    m = PF[i, PF_MARK]
    if m > 0:
        PF[i, PF_LEG] = (qty if side == BUY else -qty) * m
    return side, np.int64(lots)


@njit
def pf_mark(PF, i, S, C, eng_book):
    """Instrument ``i``'s row of PF from its core: its mark (the mid of its last usable book) and its
    net delta, gross exposure and PnL at that mark."""
    bid = eng_book[0]
    ask = eng_book[30]
    if S[S_ENG_BOOK] != 0 and bid > 0 and ask > bid and math.isfinite(ask):
        PF[i, PF_MARK] = (bid + ask) / 2.0
    pos = position(S, C)
    m = PF[i, PF_MARK]
    delta = 0.0 if pos == 0 else pos * m  # no mark yet (NaN) and a position: the rules fail closed
    PF[i, PF_DELTA] = delta
    PF[i, PF_GROSS] = abs(delta)
    PF[i, PF_PNL] = usdt(S[S_CASH_HI], S[S_CASH_LO]) + delta


@njit
def pf_leave(PI, PF, i, S, C, eng_book):
    """After a step of instrument ``i``: the counters it moved, and its row of PF."""
    PI[PI_OID] = S[S_OID]
    PI[PI_RID] = S[S_RID]
    PI[PI_CMD_ID] = S[S_CMD_ID]
    PI[PI_SEQ] = S[S_HEAP_SEQ]
    PI[PI_LAG_USED] = S[S_LAG_USED]
    pf_mark(PF, i, S, C, eng_book)


@njit
def step_pull(S, C, OI, OF, heap, olat, work, out):
    """Another instrument of the portfolio saw EMERGENCY: quotes are pulled here too and stay pulled
    for the emergency hold, as on an EMERGENCY label of this instrument's own."""
    until = S[S_NOW] + C[C_EMERGENCY_HOLD]
    if until > S[S_EMERGENCY_UNTIL]:
        S[S_EMERGENCY_UNTIL] = until
    _cancel_all(S, C, OI, OF, heap, olat, work, out)


# ---------------------------------------------------------------- Kev as the portfolio hub
# What a hub's Kev context reads besides the cores (engine/instruments.py builds the context): every
# configured pair's fit (PS: a pair_state row per pair, engine/kev/pairs.py; PP: its leader's and
# follower's instrument, whether it has an observation yet and the time of the last) and each
# instrument's latest labels (LR: a row per instrument, the count seen, then a ring of LABELS_KEPT).
PP_LEADER, PP_FOLLOWER, PP_SEEN, PP_T = 0, 1, 2, 3
PP_COLS = 4
LABELS_KEPT = 3


@njit
def pf_observe(PF, PS, PP, i, t_ns, half_life_ns):
    """Instrument ``i`` has a new mark at ``t_ns`` (its book's receive time): every pair with it as a
    leg takes one observation of both legs' marks (a leg with no book yet: none)."""
    for k in range(PS.shape[0]):
        li = PP[k, PP_LEADER]
        fi = PP[k, PP_FOLLOWER]
        if i != li and i != fi:
            continue
        ml = PF[li, PF_MARK]
        mf = PF[fi, PF_MARK]
        if not (ml > 0 and mf > 0):  # NaN too
            continue
        dt = 0.0 if PP[k, PP_SEEN] == 0 else float(t_ns - PP[k, PP_T])
        pair_update(PS[k], math.log(ml), math.log(mf), dt, half_life_ns)
        PP[k, PP_SEEN] = 1
        PP[k, PP_T] = t_ns


@njit
def pf_note_label(LR, i, label):
    """Instrument ``i``'s label ``label`` became visible: the latest LABELS_KEPT are kept."""
    n = LR[i, 0]
    LR[i, 1 + n % LABELS_KEPT] = label
    LR[i, 0] = n + 1


def latest_labels(LR: np.ndarray, i: int) -> list[int]:
    """Instrument ``i``'s latest labels kept by :func:`pf_note_label`, the oldest first."""
    n = int(LR[i, 0])
    return [int(LR[i, 1 + k % LABELS_KEPT]) for k in range(max(0, n - LABELS_KEPT), n)]
