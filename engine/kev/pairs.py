"""The pairs rule: an online hedge-ratio fit of a cointegrated pair and a mean-reversion decision on it.

Compiled with :func:`engine.jit.njit` over an explicit float64 state array (:func:`pair_state`), so the
engine's compiled core can keep one row per configured pair; every function also runs as plain Python
(``NUMBA_DISABLE_JIT=1``) and gives the same bits.

``pair_update(state, log_leader, log_follower, dt_ns, half_life_ns) -> None``
    One observation of the pair (natural logs of both mids), ``dt_ns`` after the previous one (>= 0;
    the first observation's dt is ignored). Weights decay by ``2 ** (-elapsed / half_life_ns)``.
    The hedge ratio ``beta`` is the weighted least-squares slope through 0 of the follower's log
    return on the leader's, a return taken each time at least ``half_life_ns / RETURN_STEPS`` has
    passed since the last one (a 60 s half-life: returns of about 2 s, long enough that the two
    feeds' asynchronous updates bias the slope little). Returns, not levels: the spread is an
    autocorrelated process as large as the leader's moves over a window, so a regression of levels
    has few independent points in it and its slope wanders (on the simulator's sessions by up to
    half the true beta), while a return regression has a point every step and follows each regime's
    beta. ``alpha`` is ``mean(log f) - beta * mean(log l)`` over the levels' weighted means, the
    spread ``log_f - alpha - beta * log_l``, folded into its own weighted mean and variance (same
    half-life; West's incremental form throughout, stable on log prices around 11). Raises
    ``ValueError`` for a negative dt or a half-life <= 0.

``pair_z(state) -> float``
    The last spread's z-score against the spread's weighted mean and sd; NaN until
    :data:`PAIR_MIN_UPDATES` spreads were seen or while the spread's variance is 0.

``pairs_decide(z, position_leader, position_follower, beta, price_leader, price_follower, entry_z,
exit_z, max_leader, max_follower) -> (target_leader, target_follower, hedge_ratio, why)``
    Mean reversion with hysteresis. ``z > entry_z``: the follower is rich, so short the follower and
    buy the leader; ``z < -entry_z``: the other way round. ``|z| < exit_z``: both legs flat. Otherwise
    (and whenever ``z`` is NaN, ``beta`` is not a positive finite number or a price is not positive)
    both positions are held as they are. An entry puts ``max_follower`` on the follower and
    ``beta * q_follower * price_follower / price_leader`` on the leader: the leader's USD notional is
    beta times the follower's, so a move of the leader (which moves ``log f`` by beta times as much)
    leaves the pair flat in USD. When that leader leg would exceed ``max_leader`` both legs shrink by
    the same factor. Targets are rounded to 6 decimals. ``hedge_ratio`` is ``beta`` clipped to
    :data:`engine.kev.command.PAIR_HEDGE_RATIO_RANGE` and rounded to 6 decimals (1.0 when beta is
    not finite), and the legs are sized with it; ``why`` indexes
    :data:`WHY_PAIRS_TEXT`.

``pair_beta_se(state) -> float`` is the hedge ratio's standard error, ``pair_series`` runs
``pair_update`` and ``pair_z`` over arrays. State layout: the ``P_*`` indices below,
:data:`PAIR_STATE_SIZE` float64 values; :func:`pair_state` makes a fresh one.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import orjson

from engine.contract import round_exact
from engine.errors import DualhubError
from engine.exact import pmax, pmin
from engine.jit import njit
from engine.kev.advisor import KevContextV2, KevReply, context_body_v2
from engine.kev.command import (
    PAIR_HEDGE_RATIO_RANGE,
    SCHEMA_VERSION_V2,
    TARGET_POSITION_ABS_MAX,
    check_pairs,
)
from engine.kev.rules import slippage_bps

P_N = 0  # observations seen
P_W = 1  # total weight of the observations (decayed)
P_MX = 2  # weighted mean of log leader
P_MY = 3  # weighted mean of log follower
P_RX0 = 4  # log leader at the start of the return being accumulated
P_RY0 = 5  # log follower there
P_RT = 6  # ns since that start
P_RN = 7  # returns taken
P_RW = 8  # total weight of the returns
P_RXX = 9  # weighted sums over returns: leader squared, leader x follower, follower squared
P_RXY = 10
P_RYY = 11
P_RXX2 = 12  # sum of squared weights x leader return squared (the slope's standard error)
P_ALPHA = 13  # NaN until the first return
P_BETA = 14
P_SPREAD = 15  # the last spread under the fit it was computed with
P_SN = 16  # spreads seen
P_SW = 17  # total weight of the spreads
P_SMEAN = 18  # weighted mean of the spread
P_SM2 = 19  # weighted second moment of the spread about its mean
PAIR_STATE_SIZE = 20
RETURN_STEPS = 32  # returns per half-life
PAIR_MIN_UPDATES = 32  # spreads before a z-score is given

LN2 = math.log(2.0)

WHY_NOT_READY, WHY_ENTER_SHORT_FOLLOWER, WHY_ENTER_LONG_FOLLOWER, WHY_EXIT, WHY_HOLD = range(5)
WHY_PAIRS_TEXT = (
    "{follower}/{leader}: no fit yet, hold",
    "{follower}/{leader} z={z:+.2f}: {follower} rich, sell it, buy {leader} x{beta:.3f}",
    "{follower}/{leader} z={z:+.2f}: {follower} cheap, buy it, sell {leader} x{beta:.3f}",
    "{follower}/{leader} z={z:+.2f}: spread back, flat",
    "{follower}/{leader} z={z:+.2f}: hold",
)
_HR_LO, _HR_HI = PAIR_HEDGE_RATIO_RANGE


def pair_state() -> np.ndarray:
    """A fresh pair state: no observation yet."""
    state = np.zeros(PAIR_STATE_SIZE, dtype=np.float64)
    state[P_BETA] = np.nan
    state[P_ALPHA] = np.nan
    state[P_SPREAD] = np.nan
    return state


@njit
def pair_update(
    state: np.ndarray, log_leader: float, log_follower: float, dt_ns: float, half_life_ns: float
) -> None:
    """Fold one observation into ``state`` (see the module docstring)."""
    if not half_life_ns > 0:
        raise ValueError("pair_update: half_life_ns must be > 0")
    if not dt_ns >= 0:
        raise ValueError("pair_update: dt_ns must be >= 0")
    x = log_leader
    y = log_follower
    first = state[P_N] == 0.0
    decay = 0.0 if first else math.exp(-LN2 * (dt_ns / half_life_ns))
    w = decay * state[P_W] + 1.0
    mx = state[P_MX] + (x - state[P_MX]) / w
    my = state[P_MY] + (y - state[P_MY]) / w
    state[P_MX] = mx
    state[P_MY] = my
    state[P_W] = w
    state[P_N] += 1.0
    if first:
        state[P_RX0] = x
        state[P_RY0] = y
        state[P_RT] = 0.0
        return
    state[P_RT] += dt_ns
    if state[P_RT] * RETURN_STEPS >= half_life_ns:
        rdecay = math.exp(-LN2 * (state[P_RT] / half_life_ns)) if state[P_RN] > 0.0 else 0.0
        rx = x - state[P_RX0]
        ry = y - state[P_RY0]
        state[P_RW] = rdecay * state[P_RW] + 1.0
        state[P_RXX] = rdecay * state[P_RXX] + rx * rx
        state[P_RXY] = rdecay * state[P_RXY] + rx * ry
        state[P_RYY] = rdecay * state[P_RYY] + ry * ry
        state[P_RXX2] = rdecay * rdecay * state[P_RXX2] + rx * rx
        state[P_RN] += 1.0
        state[P_RX0] = x
        state[P_RY0] = y
        state[P_RT] = 0.0
        if state[P_RXX] > 0.0:
            state[P_BETA] = state[P_RXY] / state[P_RXX]
    beta = state[P_BETA]
    if not math.isfinite(beta):
        return
    alpha = my - beta * mx
    state[P_ALPHA] = alpha
    s = y - alpha - beta * x
    state[P_SPREAD] = s
    sdecay = decay if state[P_SN] > 0.0 else 0.0
    sw = sdecay * state[P_SW] + 1.0
    ds = s - state[P_SMEAN]
    smean = state[P_SMEAN] + ds / sw
    state[P_SM2] = sdecay * state[P_SM2] + ds * (s - smean)
    state[P_SMEAN] = smean
    state[P_SW] = sw
    state[P_SN] += 1.0


@njit
def pair_beta_se(state: np.ndarray) -> float:
    """The standard error of the fitted hedge ratio, as if the weighted returns were independent:
    ``sqrt(s2 * sum(w^2 x^2)) / sum(w x^2)`` with ``s2`` the weighted mean squared residual. NaN
    before two returns."""
    if state[P_RN] < 2.0 or not state[P_RXX] > 0.0:
        return np.nan
    beta = state[P_RXY] / state[P_RXX]
    s2 = (state[P_RYY] - beta * state[P_RXY]) / state[P_RW]
    return math.sqrt(pmax(s2, 0.0) * state[P_RXX2]) / state[P_RXX]


@njit
def pair_z(state: np.ndarray) -> float:
    """The last spread's z-score; NaN until the fit is warm (see the module docstring)."""
    if state[P_SN] < PAIR_MIN_UPDATES or state[P_SW] <= 0.0:
        return np.nan
    var = state[P_SM2] / state[P_SW]
    if not var > 0.0:
        return np.nan
    return (state[P_SPREAD] - state[P_SMEAN]) / math.sqrt(var)


@njit
def pair_series(
    state: np.ndarray,
    dt_ns: np.ndarray,
    log_leader: np.ndarray,
    log_follower: np.ndarray,
    half_life_ns: float,
    beta_out: np.ndarray,
    z_out: np.ndarray,
) -> None:
    """:func:`pair_update` over each row in order, writing the hedge ratio and :func:`pair_z` after it."""
    for i in range(len(dt_ns)):
        pair_update(state, log_leader[i], log_follower[i], dt_ns[i], half_life_ns)
        beta_out[i] = state[P_BETA]
        z_out[i] = pair_z(state)


@njit
def pairs_decide(
    z: float,
    position_leader: float,
    position_follower: float,
    beta: float,
    price_leader: float,
    price_follower: float,
    entry_z: float,
    exit_z: float,
    max_leader: float,
    max_follower: float,
) -> tuple[float, float, float, int]:
    """(target leader, target follower, hedge ratio, why): see the module docstring."""
    finite_beta = math.isfinite(beta)
    hedge = round_exact(pmax(_HR_LO, pmin(_HR_HI, beta)), 6) if finite_beta else 1.0
    if not (math.isfinite(z) and finite_beta and beta > 0.0 and price_leader > 0.0 and price_follower > 0.0):
        return position_leader, position_follower, hedge, WHY_NOT_READY
    if abs(z) < exit_z:
        return 0.0, 0.0, hedge, WHY_EXIT
    if abs(z) <= entry_z:
        return position_leader, position_follower, hedge, WHY_HOLD
    q_f = max_follower
    q_l = hedge * q_f * price_follower / price_leader
    if q_l > max_leader:
        q_f = q_f * (max_leader / q_l)
        q_l = max_leader
    q_f = round_exact(q_f, 6)
    q_l = round_exact(q_l, 6)
    if z > 0.0:
        return q_l, -q_f, hedge, WHY_ENTER_SHORT_FOLLOWER
    return -q_l, q_f, hedge, WHY_ENTER_LONG_FOLLOWER


PAIRS_RULES_VERSION = "rules-pairs-v1"


class RulePairsKev:
    """The pairs rule as a Kev advisor: a v2 command from a v2 context (:class:`KevContextV2`), one
    :func:`pairs_decide` per configured pair, with the z-score and hedge ratio the context carries.

    A follower's target is its pair's. A leader of one pair is given its own position; a leader of
    several pairs gets the sum of their leader legs, each pair given the leader leg its follower's
    position implies (``-hedge * position_f * mark_f / mark_l``). An instrument in no pair keeps its
    position. An EMERGENCY label among any instrument's latest labels flattens everything.
    ``action`` follows the first pair whose follower's target moves (HOLD if none does)."""

    name = "rules-pairs"

    def __init__(self, *, entry_z: float = 2.0, exit_z: float = 0.5) -> None:
        if not (math.isfinite(entry_z) and math.isfinite(exit_z) and 0.0 <= exit_z < entry_z):
            raise DualhubError(f"pairs rule: need 0 <= exit_z < entry_z, got {exit_z} and {entry_z}")
        self.entry_z = entry_z
        self.exit_z = exit_z

    async def advise(self, ctx: KevContextV2) -> KevReply:
        return self.advise_now(ctx)

    def advise_now(self, ctx: KevContextV2) -> KevReply:
        return KevReply(raw=self.decide(ctx), key=self.key(ctx))

    def key(self, ctx: KevContextV2) -> str:
        body = {"rules": PAIRS_RULES_VERSION, "params": [self.entry_z, self.exit_z], **context_body_v2(ctx)}
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def decide(self, ctx: KevContextV2) -> dict[str, object]:
        why_not = check_pairs(ctx.symbols, ctx.pair_keys)
        if why_not:
            raise DualhubError(f"pairs rule: {why_not}")
        inst = {i.symbol: i for i in ctx.instruments}
        slip = max(slippage_bps(i.mark, i.spread) for i in ctx.instruments)
        hedges = [p.hedge_ratio for p in ctx.pairs]
        emergency = [i.symbol for i in ctx.instruments if "EMERGENCY" in i.labels]
        if ctx.label == "EMERGENCY" and ctx.symbol not in emergency:
            emergency.insert(0, ctx.symbol)
        if emergency:
            return self._command(
                "EMERGENCY_FLATTEN",
                {s: 0.0 for s in inst},
                ctx,
                [pairs_decide(np.nan, 0.0, 0.0, h, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0)[2] for h in hedges],
                slip,
                f"emergency label on {', '.join(emergency)}: flatten",
            )
        targets = {s: i.position for s, i in inst.items()}
        leads = [p.leader for p in ctx.pairs]
        leader_sum = {lead: 0.0 for lead in leads}
        ratios, reasons = [], []
        action = "HOLD"
        for p in ctx.pairs:
            lead, fol = inst[p.leader], inst[p.follower]
            if leads.count(p.leader) == 1:
                pos_l = lead.position
            elif math.isfinite(p.hedge_ratio) and lead.mark > 0:
                pos_l = -p.hedge_ratio * fol.position * fol.mark / lead.mark
            else:
                pos_l = 0.0
            tl, tf, hedge, why = pairs_decide(
                p.z,
                pos_l,
                fol.position,
                p.hedge_ratio,
                lead.mark,
                fol.mark,
                self.entry_z,
                self.exit_z,
                lead.max_position,
                fol.max_position,
            )
            leader_sum[p.leader] += tl
            targets[p.follower] = tf
            ratios.append(hedge)
            z = p.z if math.isfinite(p.z) else 0.0
            reasons.append(WHY_PAIRS_TEXT[why].format(leader=p.leader, follower=p.follower, z=z, beta=hedge))
            if action == "HOLD" and tf != fol.position:
                action = "LEAN_BUY" if tf > fol.position else "LEAN_SELL"
        for lead_sym, total in leader_sum.items():
            targets[lead_sym] = round_exact(total, 6)
        return self._command(action, targets, ctx, ratios, slip, "; ".join(reasons))

    @staticmethod
    def _command(
        action: str,
        targets: dict[str, float],
        ctx: KevContextV2,
        ratios: list[float],
        slip: float,
        reason: str,
    ) -> dict[str, object]:
        cap = TARGET_POSITION_ABS_MAX
        return {
            "schema_version": SCHEMA_VERSION_V2,
            "action": action,
            "targets": {s: max(-cap, min(cap, targets[s])) for s in ctx.symbols},
            "pairs": [
                {"leader": p.leader, "follower": p.follower, "hedge_ratio": r}
                for p, r in zip(ctx.pairs, ratios, strict=True)
            ],
            "max_slippage_bps": slip,
            "reason": reason[:120],
        }
