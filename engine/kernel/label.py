"""A Laya label reaching the engine (``_on_label``): an EMERGENCY pull, the requote, a Kev request
offered, the rebalance towards Kev's target.
"""

from __future__ import annotations

from engine.jit import njit
from engine.kernel.kev import _offer_kev
from engine.kernel.layout import (
    C_EMERGENCY_HOLD,
    C_KEV_MIN_INTERVAL,
    C_REBALANCE_MIN,
    C_REQUOTE_MIN,
    L_EMERGENCY,
    L_HOLD,
    S_CMD,
    S_CMD_VALID_UNTIL,
    S_EMERGENCY_UNTIL,
    S_LAST_KEV_OFFER,
    S_LAST_LABEL_NAME,
    S_LAST_REBALANCE,
    S_LAST_REQUOTE,
    S_NOW,
    S_UNIT,
    S_UNIT_DUE,
    S_WHY,
    U_NONE,
)
from engine.kernel.orders import _cancel_all, _rebalance, _requote, leg_order
from engine.strategy import NO_ORDER


@njit
def _on_label(
    r,
    label_id,
    p_label32,
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
    levels,
    level_row0,
    lags,
    out,
    lpx,
    lq,
):
    now = S[S_NOW]
    S[S_LAST_LABEL_NAME] = label_id
    origin = b_loc[r]
    if label_id == L_EMERGENCY:
        S[S_EMERGENCY_UNTIL] = now + C[C_EMERGENCY_HOLD]
        _cancel_all(S, C, OI, OF, heap, olat, work, out)
    if label_id != L_HOLD and now - S[S_LAST_KEV_OFFER] >= C[C_KEV_MIN_INTERVAL]:
        _offer_kev(
            r,
            label_id,
            float(p_label32),
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
        )
        if S[S_WHY] != U_NONE:
            return
    if now - S[S_LAST_REQUOTE] >= C[C_REQUOTE_MIN]:
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
            origin,
            False,
            out,
            lpx,
            lq,
        )
        if S[S_WHY] != U_NONE:
            return
    if S[S_CMD] != 0 and now <= S[S_CMD_VALID_UNTIL] and now - S[S_LAST_REBALANCE] >= C[C_REBALANCE_MIN]:
        if S[S_UNIT] != 0:  # a hub's instrument never trades its leg alone: the unit sends every leg
            if leg_order(S, SF, C, CF, OI, work)[0] != NO_ORDER:
                S[S_UNIT_DUE] = origin if origin > 0 else 1
            return
        _rebalance(
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
            out,
            lpx,
            lq,
        )
