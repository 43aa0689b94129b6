"""The replay's compiled loop: the decision core (``engine/kernel/``) and the simulated exchange
(``venue/kernel.py``) as one state machine over the merged walk of a session.

Each walk entry (a book or trade at the exchange, a book at the engine, a label becoming visible) and
each due timer is one step; after each, the orders the engine accepted go to the simulated exchange
(``forward``), as live mode hands them to Bitget. The loop stops whenever :mod:`replay.fast_path`
must act (an output buffer is full, a table must grow, Kev lags or order latencies must be drawn, a
Kev request must be answered in Python) and resumes where it stopped.

This module also names the core's layout and codes for the loop's driver and tests.
"""

from __future__ import annotations

import inspect
from typing import Any

import numba as nb
import numpy as np
from numba.extending import overload

from engine.jit import njit
from engine.kernel import *  # noqa: F403 - the core's layout and codes, under the loop's name too
from engine.kernel import (  # noqa: F401 - tests reach some of these through the loop's name
    HF_COLS,
    Heap,
    HI_COLS,
    L_EMERGENCY,
    O_ORDER,
    OI_REFS,
    PI_CUR,
    PI_FAN,
    PI_HUB,
    PI_WALK,
    S_CMD_ID,
    S_ENG_BOOK,
    S_ENG_ROW,
    S_HEAP_N,
    S_KEV_ASKED,
    S_LABELS,
    S_NOW,
    S_NREST,
    S_SENT,
    S_WHY,
    S_XBOOK,
    ST_DONE,
    ST_HUB,
    ST_NEED_KEV,
    ST_UNSUPPORTED,
    T_ARRIVE,
    T_ARRIVE_CANCEL,
    T_KEV_DONE,
    T_REPORT,
    U_LOOK_AHEAD,
    U_NONE,
    _check_new,
    _engine_timer,
    _headroom,
    _heap_pop,
    _on_label,
    pf_enter,
    pf_leave,
    pf_note_label,
    pf_observe,
    pyround,
    step_pull,
    tag_rows,
)
from venue.fills import FM_QUEUE_LOG, FM_QUEUE_POWER, FM_RISK_AVERSE, FM_THROUGH, FM_TOUCH  # noqa: F401
from venue.kernel import (  # noqa: F401 - tests reach some of these through the loop's name
    _recorded,
    forward,
    x_arrive,
    x_arrive_cancel,
    x_on_book,
    x_on_trade,
)


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
    """A timer of the loop's heap: the simulated exchange's (an order or cancel arriving), else the
    engine's."""
    OUTI, OUTF, NOUT = out
    kind = tmpi[3]
    a = tmpi[4]
    if kind <= T_REPORT:
        OI[a & (OI.shape[0] - 1), OI_REFS] -= 1
    if kind == T_ARRIVE:
        x_arrive(S, C, CF, OI, OF, heap, olat, rest, x_book, a, lpx, lq)
    elif kind == T_ARRIVE_CANCEL:
        x_arrive_cancel(S, C, OI, heap, olat, rest, a)
    else:
        _engine_timer(
            tmpi, tmpf, S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight, recent,
            eng_book, x_book, b_loc, lags, out, lpx, lq,
        )  # fmt: skip
    forward(S, C, OI, heap, olat, OUTI, NOUT)


# ---------------------------------------------------------------- the loop, for one instrument or several
# One loop for every replay: a portfolio's (replay/fast_path.py run_portfolio_kernel drives it), and a
# single instrument's as a portfolio of one (run_kernel), where pf_enter/pf_leave and the row tags
# are skipped. One walk merging every
# instrument's entries (walk_inst names each one's instrument), a core per instrument, one output
# buffer, and the portfolio's shared counters and risk view (PI, PF: engine/kernel/). CORES[j] holds
# instrument j's arrays as one tuple (S, SF, C, CF, OI, OF, RI, RF, HI, HF, work, rest, kq, inflight,
# recent, eng_book, x_book, olat), where a numba typed list hands out each array in tens of ns. A step
# reaches its core through a constant index (:func:`on_core`): ``CORES[j]`` with j a variable makes
# LLVM copy the whole tuple (~160 words) through the stack at every step. The loop is compiled
# without reference counting, its steps inlined: unpacking a core then costs no reference per array,
# and a step no call with the ~300 scalar arguments a core's arrays flatten to. Around
# every step of instrument j: pf_enter, the step, its rows tagged j, pf_leave, as the per-event engine
# does (engine/core.py). The timers of every core run in one order: the least (time, priority, seq)
# first, the seq shared (PI_SEQ), as on one clock.


# Portfolios of up to this many instruments reach a core by a constant index (a pair, two pairs);
# larger ones by a variable one, which copies the core's tuple at every step. Each constant index
# inlines another copy of the steps: four instruments compile in ~40 s instead of ~15 s (1.8 GB while
# compiling) and then replay ~20% faster (bench/HISTORY.md); for eight the compile would outweigh it.
STATIC_CORES = 4


def on_core(body: Any) -> Any:
    """``f(..., j, ..., CORES, ...)`` that runs the compiled ``body(CORES[j], ...)`` (``body``'s other
    parameters, which name ``j`` and ``CORES``). Compiled for a tuple of at most :data:`STATIC_CORES`,
    ``CORES[j]`` is taken by constant indices: a chain ``if j == 0: body(CORES[0], ...)`` and so on,
    one inlined copy of ``body`` per instrument. Read as plain Python (``NUMBA_DISABLE_JIT``), and
    compiled for a longer tuple, it is that call with ``CORES[j]``."""
    params = list(inspect.signature(getattr(body, "py_func", body)).parameters)[1:]
    args = ", ".join(params)
    by_variable = f"return body(CORES[j], {args})"
    ns: dict[str, Any] = {"body": body}
    exec(f"def f({args}):\n    {by_variable}\n", ns)  # noqa: S102 - our own source
    f = ns["f"]
    f.__doc__ = body.__doc__
    if nb.config.DISABLE_JIT:
        return f

    def chain(n: int) -> Any:
        if n > STATIC_CORES:
            cases = [by_variable]
        else:  # j is one of 0 .. n-1: the last needs no test
            cases = [f"if j == {i}: return body(CORES[{i}], {args})" for i in range(n - 1)]
            cases.append(f"return body(CORES[{n - 1}], {args})")
        lines = [f"def impl({args}):", *(f"    {c}" for c in cases)]
        code: dict[str, Any] = {"body": body}
        exec("\n".join(lines), code)  # noqa: S102 - our own source
        return code["impl"]

    ns["chain"] = chain
    exec(f"def typer({args}):\n    return chain(CORES.count)\n", ns)  # noqa: S102 - our own source
    overload(f, inline="always")(ns["typer"])
    return f


@njit(inline="always")
def _top(TOP, j, S, HI):
    """Note instrument j's next timer (time, priority, seq) in TOP[j], after a step that may have moved
    it: the loop picks the next timer from TOP without reaching into every core."""
    if S[S_HEAP_N] == 0:
        TOP[j, 0] = 0
    else:
        TOP[j, 0] = 1
        TOP[j, 1] = HI[0, 0]
        TOP[j, 2] = HI[0, 1]
        TOP[j, 3] = HI[0, 2]


@njit(inline="always")
def _tops(TOP, CORES, n):
    """Every instrument's next timer (Python may have scheduled some between two calls)."""
    for j in range(n):
        core = CORES[j]
        _top(TOP, j, core[0], core[8])


@njit(inline="always")
def _due(TOP, n, t, p, bounded):
    """The instrument whose next timer runs first (the least (time, priority, seq) over every core's
    heap), or -1 when none has one (``bounded``: none that sorts before the walk entry at (t, p))."""
    best = -1
    bt = 0
    bp = 0
    bs = 0
    for j in range(n):
        if TOP[j, 0] == 0:
            continue
        ht, hp, hs = TOP[j, 1], TOP[j, 2], TOP[j, 3]
        if best < 0 or ht < bt or (ht == bt and (hp < bp or (hp == bp and hs < bs))):
            best, bt, bp, bs = j, ht, hp, hs
    if best >= 0 and bounded and not (bt < t or (bt == t and bp < p)):
        return -1
    return best


@njit(inline="always")
def _leg_first(PI, TOP, j, t, p):
    """Whether a hub's leg check (PI_LEG_DUE, priority PRIO_LEG: engine/legs.py) runs before the walk
    entry at (t, p) and before instrument j's next timer (j < 0: none)."""
    due = PI[PI_LEG_DUE]
    if due <= 0 or not (due < t or (due == t and PRIO_LEG < p)):
        return False
    return j < 0 or due < TOP[j, 1] or (due == TOP[j, 1] and PRIO_LEG < TOP[j, 2])


@njit(inline="always")
def _enter(j, n, S, SF, NOUT, PI, PF, before):
    """Before a step of instrument j: the portfolio's counters and risk view, and the rows before it
    (another instrument's, handed on already)."""
    if n > 1:
        pf_enter(PI, PF, j, S, SF)
        S[S_SENT] = NOUT[O_ORDER]
        for s in range(NOUT.shape[0]):
            before[s] = NOUT[s]


@njit(inline="always")
def _leave(j, n, S, C, eng_book, OUTI, NOUT, PI, PF, before):
    if n > 1:
        tag_rows(OUTI, NOUT, before, j)
        pf_leave(PI, PF, j, S, C, eng_book)


@njit(inline="always")
def _stop(j, S, PI):
    """ST_DONE after a step of instrument j, or the stop it needs now: its rows ask Kev (answered before
    any other step: Kev's lags are drawn in the order the instruments ask), or it cannot go on."""
    PI[PI_CUR] = j
    if S[S_WHY] != U_NONE:
        return ST_UNSUPPORTED
    if S[S_KEV_ASKED] > 0:
        return ST_NEED_KEV
    if S[S_UNIT_DUE] != 0:
        return ST_UNIT
    return ST_DONE


def pf_scratch(n: int, streams: int) -> tuple[np.ndarray, ...]:
    """The loop's working arrays, made in Python so that the loop is compiled without reference counting
    (an array made in compiled code needs it): a popped timer (its int and float columns), the book
    walk's levels (prices, sizes), the row counts before a step, and every instrument's next timer."""
    return (
        np.zeros(HI_COLS, dtype=np.int64),
        np.zeros(HF_COLS, dtype=np.float64),
        np.zeros(16, dtype=np.float64),
        np.zeros(16, dtype=np.float64),
        np.zeros(streams, dtype=np.int64),
        np.zeros((n, 4), dtype=np.int64),
    )


@njit(inline="always")
def _room(o, n, S, SF, OI, RI, HI, olat, work, inflight, PI, PF, NOUT, out_cap, lags):
    """Room for a step of instrument o, or the stop that makes it."""
    if n > 1:
        pf_enter(PI, PF, o, S, SF)
    st = _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight)
    if st != ST_DONE:
        PI[PI_CUR] = o
    return st


@njit(inline="always")
def _timer_pf_at(
    core, j, n, CORES, PI, PF, BL, lags, out, out_cap, tmpi, tmpf, lpx, lq, before, TOP
):  # fmt: skip
    """The next timer of instrument j's heap (``core`` is CORES[j]). Inlined, as :func:`_pf_entry`."""
    OUTI, OUTF, NOUT = out
    S, SF, C, CF, OI, OF, RI, RF, HI, HF, work, rest, kq, inflight, recent, eng_book, x_book, olat = core
    heap = Heap(HI, HF)
    st = _room(j, n, S, SF, OI, RI, HI, olat, work, inflight, PI, PF, NOUT, out_cap, lags)
    if st != ST_DONE:
        return st
    _enter(j, n, S, SF, NOUT, PI, PF, before)
    _heap_pop(S, heap, tmpi, tmpf)
    S[S_NOW] = tmpi[0]
    cid = S[S_CMD_ID]
    _timer(
        tmpi, tmpf, S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight, recent, eng_book,
        x_book, BL[j], lags, out, lpx, lq,
    )  # fmt: skip
    _leave(j, n, S, C, eng_book, OUTI, NOUT, PI, PF, before)
    _top(TOP, j, S, HI)
    if PI[PI_HUB] != 0 and tmpi[3] == T_KEV_DONE and S[S_CMD_ID] != cid:
        PI[PI_FAN] = tmpi[4] + 1  # Kev's reply became a command: the others' parts are next
    st = _stop(j, S, PI)
    if st == ST_DONE and PI[PI_FAN] != 0:
        return ST_HUB
    return st


_timer_pf = on_core(_timer_pf_at)


@njit(inline="always")
def _pf_entry_at(
    core, t, k, j, r, n, CORES, LV, L0, BL, LB, PR, TPX, TSZ, TSD, lags, PI, PF, PS, PP, LR, half_life_ns,
    out, out_cap, lpx, lq, before, TOP,
):  # fmt: skip
    """Walk entry (t, kind k, row r) of instrument j (``core`` is CORES[j]): (status, whether the entry
    is done). Inlined into the loop, which is compiled without reference counting: a portfolio's
    instruments take turns nearly every entry, and each switch unpacks a core's 18 arrays (with
    reference counting, an incref and a decref each; as a call of its own, ~300 scalar arguments)."""
    OUTI, OUTF, NOUT = out
    S, SF, C, CF, OI, OF, RI, RF, HI, HF, work, rest, kq, inflight, recent, eng_book, x_book, olat = core
    heap = Heap(HI, HF)
    st = _room(j, n, S, SF, OI, RI, HI, olat, work, inflight, PI, PF, NOUT, out_cap, lags)
    if st != ST_DONE:
        return st, False
    # An EMERGENCY label pulls every instrument's quotes: each needs room for its cancels first.
    pull = k == 4 and n > 1 and LB[j][r] == L_EMERGENCY
    if pull:
        for o in range(n):
            if o != j:
                So, SFo, _, _, OIo, _, RIo, _, HIo, _, worko, _, _, inflo, _, _, _, olo = CORES[o]
                st = _room(o, n, So, SFo, OIo, RIo, HIo, olo, worko, inflo, PI, PF, NOUT, out_cap, lags)
                if st != ST_DONE:
                    return st, False
    _enter(j, n, S, SF, NOUT, PI, PF, before)
    S[S_NOW] = t
    if k == 0:  # book at the exchange
        levels = LV[j]
        row = r - L0[j]
        for c in range(60):
            x_book[c] = levels[row, c]
        S[S_XBOOK] = 1
        x_on_book(S, C, CF, OI, OF, heap, olat, rest, x_book)
    elif k == 2:  # book at the engine
        levels = LV[j]
        row = r - L0[j]
        for c in range(60):
            eng_book[c] = levels[row, c]
        S[S_ENG_ROW] = r
        S[S_ENG_BOOK] = 1
    elif k == 4:  # Laya's label of book r becomes visible
        b_loc = BL[j]
        if b_loc[r] > t:  # never read a label whose book has not arrived (no look-ahead)
            S[S_WHY] = U_LOOK_AHEAD
            PI[PI_CUR] = j
            return ST_UNSUPPORTED, False
        S[S_LABELS] += 1
        lab = LB[j][r]
        pf_note_label(LR, j, lab)
        _on_label(
            r, lab, PR[j][r, lab], S, SF, C, CF, OI, OF, RI, RF, heap, olat, work, rest, kq, inflight,
            recent, eng_book, x_book, b_loc, LV[j], L0[j], lags, out, lpx, lq,
        )  # fmt: skip
        forward(S, C, OI, heap, olat, OUTI, NOUT)
    elif k == 1:  # trade at the exchange
        if S[S_NREST] > 0:
            x_on_trade(S, C, CF, OI, OF, heap, olat, rest, TPX[j][r], TSZ[j][r], TSD[j][r])
    _leave(j, n, S, C, eng_book, OUTI, NOUT, PI, PF, before)
    if k == 2 and PS.shape[0] > 0:  # the pairs with this leg take its new mark
        pf_observe(PF, PS, PP, j, t, half_life_ns)
    _top(TOP, j, S, HI)
    st = _stop(j, S, PI)
    if st == ST_UNSUPPORTED:
        return st, False
    if pull:  # the others pull their quotes, in instrument order, at the same time
        for o in range(n):
            if o == j:
                continue
            So, SFo, Co, _, OIo, OFo, _, _, HIo, HFo, worko, _, _, _, _, ebo, _, olo = CORES[o]
            _enter(o, n, So, SFo, NOUT, PI, PF, before)
            So[S_NOW] = t
            step_pull(So, Co, OIo, OFo, Heap(HIo, HFo), olo, worko, out)
            forward(So, Co, OIo, Heap(HIo, HFo), olo, OUTI, NOUT)
            _leave(o, n, So, Co, ebo, OUTI, NOUT, PI, PF, before)
            _top(TOP, o, So, HIo)
    return st, True


_pf_entry = on_core(_pf_entry_at)


@njit
def run_pf(
    walk_ts, walk_prio, walk_kind, walk_row, walk_inst, walk_end, LV, L0, BL, LB, PR, TPX, TSZ, TSD, lags,
    CORES, PI, PF, PS, PP, LR, half_life_ns, out, out_cap, tmpi, tmpf, lpx, lq, before, TOP,
):  # fmt: skip
    """Run the walk from PI[PI_WALK] to walk_end. Returns a status (ST_*); a stop names its instrument
    in PI[PI_CUR]. LV[j] holds instrument j's book levels from row L0[j] on; BL, LB, PR its books'
    receive times, labels and probabilities; TPX, TSZ, TSD its trades. PS, PP, LR: what a hub's Kev
    context reads (engine/kernel/portfolio.py pf_observe, pf_note_label)."""
    n = PF.shape[0]
    _tops(TOP, CORES, n)
    i = PI[PI_WALK]
    while i < walk_end:
        t = walk_ts[i]
        p = walk_prio[i]
        while True:  # timers that sort before this entry
            j = _due(TOP, n, t, p, True)
            if _leg_first(PI, TOP, j, t, p):
                return ST_LEG
            if j < 0:
                break
            st = _timer_pf(j, n, CORES, PI, PF, BL, lags, out, out_cap, tmpi, tmpf, lpx, lq, before, TOP)
            if st != ST_DONE:
                return st
        st, done = _pf_entry(
            t, walk_kind[i], walk_inst[i], walk_row[i], n, CORES, LV, L0, BL, LB, PR, TPX, TSZ, TSD, lags,
            PI, PF, PS, PP, LR, half_life_ns, out, out_cap, lpx, lq, before, TOP,
        )  # fmt: skip
        if not done:
            return st
        i += 1
        PI[PI_WALK] = i
        if st != ST_DONE:  # Kev asked: answered before the next step
            return st
    return ST_DONE


@njit
def run_all_pf(CORES, PI, PF, BL, lags, out, out_cap, tmpi, tmpf, lpx, lq, before, TOP):
    """The end of the tape: every instrument's pending timers, in the one order."""
    n = PF.shape[0]
    _tops(TOP, CORES, n)
    while True:
        j = _due(TOP, n, 0, 0, False)
        if j < 0:  # nothing left that could fill a leg: a leg check still due is left out
            return ST_DONE
        if _leg_first(PI, TOP, j, TOP[j, 1] + 1, 0):
            return ST_LEG
        st = _timer_pf(j, n, CORES, PI, PF, BL, lags, out, out_cap, tmpi, tmpf, lpx, lq, before, TOP)
        if st != ST_DONE:
            return st
