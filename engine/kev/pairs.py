"""The pairs rule: an online hedge-ratio fit of a cointegrated pair and a mean-reversion decision on it.

Compiled with :func:`engine.jit.njit` over an explicit float64 state array (:func:`pair_state`), so the
engine's compiled core can keep one row per configured pair; every function also runs as plain Python
(``NUMBA_DISABLE_JIT=1``) and gives the same bits.

``pair_update(state, log_leader, log_follower, dt_ns, half_life_ns) -> None``
    One observation of the pair (natural logs of both mids), ``dt_ns`` after the previous one (>= 0;
    the first observation's dt is ignored). Weights decay by ``2 ** (-elapsed / half_life_ns)``.
    Raises ``ValueError`` for a negative dt or a half-life <= 0.

    The hedge ratio ``beta`` is a regression of the follower's log returns on the leader's, taken on a
    common clock and corrected for the two legs' asynchrony and noise:

    - *A common clock.* Every :data:`CLOCK_NS` both legs are sampled (each its latest mid, the
      observation arriving at a tick counts after it) and one return of each is taken. Returns are
      short because the slope's variance is a return's residual variance over the sum of the
      leader's squared returns: that sum is about the leader's variance over the window whatever
      the returns' length, while a return's residual (the spread's innovations, the follower's own
      moves) grows with its length. On levels the spread, an autocorrelated process as large as
      the leader's moves over a window, leaves few independent points and the slope wanders.
    - *Asynchrony and noise in both legs.* Each leg's mid is as old as its last book (the feeds
      update a few times a second, each on its own clock), so a short return of one leg is partly
      seen in the other's next or previous return, and the leader's own mid noise (tick, touch)
      adds variance to the regressor that is not in the follower: plain OLS of short returns is
      biased towards 0 (errors in variables, the Epps effect). The slope is therefore a ratio of
      long-run moments: ``sum(l_t f_s) / sum(l_t l_s)`` over all pairs of returns at most
      :data:`CLOCK_LAGS` ticks apart (the Scholes-Williams/Dimson lead-lag correction with a flat
      kernel): lagged cross products recover what the follower showed a tick late or early, lagged
      leader products cancel the leader's noise and its stale-mid smoothing in the denominator.
      The flat kernel (not Bartlett's) because a tapering one leaves part of the asynchrony bias.
    - *Regimes and the decay.* The moments decay with the pair's half-life, as the spread's mean and
      variance do: a longer memory would lower the noise but keep more of the previous regime's
      weight at the end of a short regime, a shorter one the other way round.

    ``alpha`` is ``mean(log f) - beta * mean(log l)`` over the levels' weighted means, the spread
    ``log_f - alpha - beta * log_l``, folded into its own weighted mean and variance (same half-life;
    West's incremental form throughout, stable on log prices around 11).

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

``pair_beta_se(state) -> float`` is the hedge ratio's standard error (see the function), ``pair_series`` runs
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
P_CLK = 4  # ns since the last clock tick
P_L = 5  # the latest log leader and log follower (what the next tick samples)
P_F = 6
P_GL = 7  # log leader and log follower at the last tick
P_GF = 8
P_RL1 = 9  # the leader's returns of the last CLOCK_LAGS ticks, the newest first
P_RL2 = 10
P_RF1 = 11  # the follower's
P_RF2 = 12
P_RN = 13  # ticks taken (returns)
P_RW = 14  # total weight of the returns (decayed)
P_RXX = 15  # weighted long-run sums over returns: leader x leader, leader x follower, follower x follower
P_RXY = 16
P_RYY = 17
P_RXX0 = 18  # the same sums without the lagged products (the standard error's residual variance)
P_RXY0 = 19
P_RYY0 = 20
P_RXX2 = 21  # sum of squared weights x leader return squared (the standard error)
P_ALPHA = 22  # NaN until the first return
P_BETA = 23
P_SPREAD = 24  # the last spread under the fit it was computed with
P_SN = 25  # spreads seen
P_SW = 26  # total weight of the spreads
P_SMEAN = 27  # weighted mean of the spread
P_SM2 = 28  # weighted second moment of the spread about its mean
PAIR_STATE_SIZE = 29
# The common clock: both feeds update a few times a second (each book at most ~200 ms old), so a
# 100 ms tick with lead-lag terms of two ticks spans the two legs' staleness.
CLOCK_NS = 100_000_000.0
CLOCK_LAGS = 2  # the lagged products are written out for exactly 2 (P_RL1/P_RL2, P_RF1/P_RF2)
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


@njit(inline="always")
def _tick(state: np.ndarray, decay: float) -> None:
    """One tick of the common clock: both legs' returns since the last tick folded into the long-run
    moments (the lagged products with the last CLOCK_LAGS ticks' returns, both ways)."""
    a = state[P_L] - state[P_GL]
    c = state[P_F] - state[P_GF]
    state[P_GL] = state[P_L]
    state[P_GF] = state[P_F]
    l1, l2, f1, f2 = state[P_RL1], state[P_RL2], state[P_RF1], state[P_RF2]
    lag_l = l1 + l2
    lag_f = f1 + f2
    xx0 = a * a
    xy0 = a * c
    yy0 = c * c
    d = decay if state[P_RN] > 0.0 else 0.0
    state[P_RW] = d * state[P_RW] + 1.0
    state[P_RXX] = d * state[P_RXX] + (xx0 + 2.0 * a * lag_l)
    state[P_RXY] = d * state[P_RXY] + (xy0 + a * lag_f + c * lag_l)
    state[P_RYY] = d * state[P_RYY] + (yy0 + 2.0 * c * lag_f)
    state[P_RXX0] = d * state[P_RXX0] + xx0
    state[P_RXY0] = d * state[P_RXY0] + xy0
    state[P_RYY0] = d * state[P_RYY0] + yy0
    state[P_RXX2] = d * d * state[P_RXX2] + xx0
    state[P_RL2] = l1
    state[P_RL1] = a
    state[P_RF2] = f1
    state[P_RF1] = c
    state[P_RN] += 1.0


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
        state[P_L] = x
        state[P_F] = y
        state[P_GL] = x
        state[P_GF] = y
        state[P_CLK] = 0.0
        return
    # The ticks since the last observation sample the mids that were current until now.
    clk = state[P_CLK] + dt_ns
    if clk >= CLOCK_NS:
        tick_decay = math.exp(-LN2 * (CLOCK_NS / half_life_ns))
        ticks = float(math.floor(clk / CLOCK_NS))
        clk -= ticks * CLOCK_NS
        # After CLOCK_LAGS + 1 ticks every return and lag is 0: the rest only decay the moments.
        busy = min(ticks, CLOCK_LAGS + 1.0)
        k = 0.0
        while k < busy:
            _tick(state, tick_decay)
            k += 1.0
        rest = ticks - busy
        if rest > 0.0:
            d = math.exp(-LN2 * (rest * CLOCK_NS / half_life_ns))
            state[P_RW] *= d
            state[P_RXX] *= d
            state[P_RXY] *= d
            state[P_RYY] *= d
            state[P_RXX0] *= d
            state[P_RXY0] *= d
            state[P_RYY0] *= d
            state[P_RXX2] *= d * d
            state[P_RN] += rest
        if state[P_RXX] > 0.0:
            state[P_BETA] = state[P_RXY] / state[P_RXX]
    state[P_CLK] = clk
    state[P_L] = x
    state[P_F] = y
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
    """The standard error of the fitted hedge ratio: ``sqrt(K * s2 * sum(w^2 x^2)) / S_xx`` with
    ``S_xx`` the fit's weighted long-run leader sum, ``s2`` the weighted mean squared residual return
    ``f - beta * l`` of one tick and ``K = 2 * CLOCK_LAGS + 1`` the number of return pairs each
    residual enters through the lead-lag kernel (the residuals' products with the leader's returns
    up to CLOCK_LAGS ticks away are summed, so the slope's variance is that many times an
    independent-returns OLS slope's). NaN before two returns."""
    if state[P_RN] < 2.0 or not state[P_RXX] > 0.0 or not state[P_RW] > 0.0:
        return np.nan
    beta = state[P_RXY] / state[P_RXX]
    s2 = (state[P_RYY0] - 2.0 * beta * state[P_RXY0] + beta * beta * state[P_RXX0]) / state[P_RW]
    k = 2.0 * CLOCK_LAGS + 1.0
    return math.sqrt(k * pmax(s2, 0.0) * state[P_RXX2]) / state[P_RXX]


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
