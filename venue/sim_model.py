"""The market simulator's model (``venue/simulator.py``): its parameters (:class:`SimConfig`, a follower's
:class:`PairConfig`), the seeded random streams (one per component), and the latent processes: regime,
order-flow signal, flow excitation, spread stress and the fair price, advanced a chunk at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from engine.events import BOOK_LEVELS

DEFAULT_START_MS: Final = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TICKS_PER_PX: Final = 10  # tick 0.1
LOTS_PER_UNIT: Final = 1000  # size step 0.001
GRID_MS: Final = 10
CHUNK_STEPS: Final = 1000  # 10 s of exchange time per chunk
_TAPE_BLOCK: Final = 4096
_MAX_DEPTH: Final = 256  # size-profile table length; deeper levels use the last entry
# One independent stream per component: changing how one part draws never shifts another.
_RNG_LATENT, _RNG_FLOW, _RNG_BOOK, _RNG_WIRE, _RNG_FEED, _RNG_SPREAD, _RNG_PAIR = range(7)
_CALM, _BURSTY = 0, 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PairConfig:
    """How each follower of a multi-symbol session follows the leader (:class:`MultiSim`).

    ``log F = alpha + beta * log L + spread``; the spread is an Ornstein-Uhlenbeck process with this
    half-life and stationary sd around its mean (0 at first). Regime changes come as a Poisson process
    (mean gap ``regime_mean_s``): beta is drawn anew, uniform in ``beta_range`` (alpha moves so the
    price does not jump), and the spread's mean is drawn ~ N(0, ``mean_shift_bps``). The follower's
    own moves (its order-flow signal's drift, the impact of its trades and sweeps) fade with time
    constant ``own_tau_s``: short-lived next to the spread, so the pair stays cointegrated.
    """

    beta: float = 1.2
    half_life_s: float = 60.0
    spread_sd_bps: float = 4.0
    regime_mean_s: float = 240.0
    beta_range: tuple[float, float] = (0.6, 1.8)
    mean_shift_bps: float = 15.0
    own_tau_s: float = 5.0

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and self.regime_mean_s > 0 and self.own_tau_s > 0):
            raise ValueError("half_life_s, regime_mean_s and own_tau_s must be > 0")
        if self.spread_sd_bps < 0:
            raise ValueError("spread_sd_bps must be >= 0")
        lo, hi = self.beta_range
        if not 0 < lo <= hi or self.beta <= 0 or self.mean_shift_bps < 0:
            raise ValueError("beta and beta_range must be > 0 (lo <= hi), mean_shift_bps >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Model parameters. Pairs are ``(calm, bursty)``; prices in ticks (0.1), sizes in lots (0.001).
    On another contract of a multi-symbol session the same market is rescaled: price moves keep their
    size in bps and a lot its notional (``_instrument_config``)."""

    initial_mid_px: float = 90_000.0
    warmup_ms: int = 20_000  # simulated before start_ms; its last trades form the first trade push
    regime_mean_s: tuple[float, float] = (90.0, 20.0)
    fair_vol_ticks_per_sqrt_s: tuple[float, float] = (55.0, 160.0)
    signal_drift_ticks_per_s: tuple[float, float] = (25.0, 75.0)  # drift per unit of signal
    signal_tau_s: float = 5.0
    trade_rate_per_s: tuple[float, float] = (5.0, 15.0)  # base rate; self-excitation roughly doubles it
    hawkes_jump_per_s: float = 3.0  # intensity added by each trade
    hawkes_decay_per_s: float = 6.0  # branching ratio jump/decay = 0.5
    trade_median_lots: float = 8.0
    trade_size_sigma: float = 1.5
    trade_max_lots: int = 40_000
    flow_side_gain: float = 0.8  # P(buy) = sigmoid(gain * s)
    trade_impact_ticks: float = 0.2  # permanent fair-price impact of a taker order
    level_impact_ticks: float = 1.0  # ... plus this per level it emptied
    sweep_rate_per_s: tuple[float, float] = (1 / 120, 1 / 20)
    sweep_side_gain: float = 1.5
    liquidation_share: float = 0.4  # of sweeps; the rest are blocks walking a few levels
    liquidation_median_ticks: float = 900.0  # 10 bps at 90000
    liquidation_sigma: float = 0.35
    liquidation_fills: int = 40  # levels beyond the book are spaced so a sweep prints ~this many
    block_levels_p: float = 0.25  # levels walked = 2 + Geometric(p)
    sweep_hawkes_jump_per_s: float = 30.0
    sweep_spread_jump_ticks: float = 6.0
    sweep_bursty_prob: float = 0.6
    level_median_lots: float = 150.0
    level_depth_growth: float = 0.1  # median size grows by this fraction per level of depth
    level_size_sigma: float = 1.0
    level_size_tau_s: float = 3.0  # how fast a level's size factor wanders
    imbalance_gain: float = 0.5  # log-size tilt per unit of signal (bids up, asks down)
    level_gap_ticks: tuple[float, float] = (0.8, 0.2)  # extra ticks between levels ~ Exp(a + b * depth)
    book_levels_kept: int = 25  # levels per side the simulator keeps (15 are displayed)
    hysteresis_ticks: float = 0.3  # a level is passed once f is this far through it
    lift_prob: float = 0.15  # a passed level is taken by a taker, else cancelled
    refill_prob: tuple[float, float] = (0.985, 0.8)  # per event, makers refill a gap at the touch
    pull_prob: float = 0.25  # bursty: per event, makers pull a touch level when the spread is tight
    spread_base: tuple[float, float] = (0.02, 0.6)  # target spread = 1 + floor(base + stress + U)
    spread_stress_tau_s: float = 1.5
    refill_tau_s: float = 3.0  # quantity taken from a level comes back with this time constant
    book_interval_ms: tuple[int, int] = (100, 200)
    book_push_delay_ms: int = 3
    trade_push_delay_ms: int = 2
    feed_latency_median_ms: float = 3.0
    feed_latency_sigma: float = 0.5
    trade_snapshot_len: int = 50
    pair: PairConfig = field(default_factory=PairConfig)  # followers of a multi-symbol session

    def __post_init__(self) -> None:
        lo, hi = self.book_interval_ms
        if not 0 < lo <= hi:
            raise ValueError(f"book_interval_ms must be 0 < lo <= hi, got {self.book_interval_ms}")
        if self.book_levels_kept < BOOK_LEVELS:
            raise ValueError(f"book_levels_kept must be >= {BOOK_LEVELS}, got {self.book_levels_kept}")
        if self.hawkes_jump_per_s >= self.hawkes_decay_per_s:
            raise ValueError("hawkes_jump_per_s must be < hawkes_decay_per_s (stationary flow)")
        if self.warmup_ms < 0 or self.initial_mid_px <= 0:
            raise ValueError("warmup_ms must be >= 0 and initial_mid_px > 0")


def _rng(seed: int, component: int, symbol_index: int = 0) -> np.random.Generator:
    """Symbol 0 (a single-symbol session's only one, a multi-symbol session's leader) draws from
    ``[seed, component]``, symbol ``k`` from ``[seed, component, k]``."""
    return np.random.default_rng([seed, component] if symbol_index == 0 else [seed, component, symbol_index])


class _Tape:
    """Scalar uniforms and standard normals handed out one at a time from pre-drawn blocks."""

    __slots__ = ("_rng", "_u", "_ui", "_n", "_ni")

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._u: list[float] = []
        self._ui = 0
        self._n: list[float] = []
        self._ni = 0

    def u(self) -> float:
        i = self._ui
        if i >= len(self._u):
            self._u = self._rng.random(_TAPE_BLOCK).tolist()
            i = 0
        self._ui = i + 1
        return self._u[i]

    def n(self) -> float:
        i = self._ni
        if i >= len(self._n):
            self._n = self._rng.standard_normal(_TAPE_BLOCK).tolist()
            i = 0
        self._ni = i + 1
        return self._n[i]


# ---------------------------------------------------------------- latent processes


@dataclass(slots=True)
class _Latent:
    """Carried across chunks: regime, signal, flow excitation, spread stress, exogenous fair price."""

    regime: int
    s: float
    excite: float
    stress: float
    fair: float


@dataclass(slots=True)
class _Chunk:
    s: list[float]
    regime: list[int]
    stress: list[float]
    fair: list[float]
    trades: list[int]
    sweeps: list[int]


def _latent_chunk(cfg: SimConfig, rng: np.random.Generator, st: _Latent, n: int) -> _Chunk:
    """Advance the latent state ``n`` grid steps; values are those at the start of each step."""
    dt = GRID_MS / 1000.0
    eps_s = rng.standard_normal(n).tolist()
    eps_f = rng.standard_normal(n).tolist()
    u_reg, u_n, u_sw, u_aux = rng.random((4, n)).tolist()
    phi = math.exp(-dt / cfg.signal_tau_s)
    phi_sd = math.sqrt(1.0 - phi * phi)
    p_switch = (dt / cfg.regime_mean_s[0], dt / cfg.regime_mean_s[1])
    vol = tuple(v * math.sqrt(dt) for v in cfg.fair_vol_ticks_per_sqrt_s)
    drift = tuple(k * dt for k in cfg.signal_drift_ticks_per_s)
    base = cfg.trade_rate_per_s
    p_sweep = tuple(r * dt for r in cfg.sweep_rate_per_s)
    decay = math.exp(-cfg.hawkes_decay_per_s * dt)
    z_decay = math.exp(-dt / cfg.spread_stress_tau_s)
    jump = cfg.hawkes_jump_per_s
    exp = math.exp

    out = _Chunk([0.0] * n, [0] * n, [0.0] * n, [0.0] * n, [0] * n, [])
    s_out, r_out, z_out, f_out, n_out = out.s, out.regime, out.stress, out.fair, out.trades
    r, s, e, z, f = st.regime, st.s, st.excite, st.stress, st.fair
    for j in range(n):
        if u_reg[j] < p_switch[r]:
            r = 1 - r
        s_out[j] = s
        r_out[j] = r
        z_out[j] = z
        f_out[j] = f
        # Poisson(lam) by inverting the CDF with one uniform.
        lam = (base[r] + e) * dt
        p = exp(-lam)
        c = p
        u = u_n[j]
        k = 0
        while u > c and k < 64:
            k += 1
            p *= lam / k
            c += p
        n_out[j] = k
        e = e * decay + jump * k
        if u_sw[j] < p_sweep[r]:
            out.sweeps.append(j)
            e += cfg.sweep_hawkes_jump_per_s
            z += cfg.sweep_spread_jump_ticks
            if u_aux[j] < cfg.sweep_bursty_prob:
                r = _BURSTY
        z *= z_decay
        f += drift[r] * s + vol[r] * eps_f[j]
        s = phi * s + phi_sd * eps_s[j]
    st.regime, st.s, st.excite, st.stress, st.fair = r, s, e, z, f
    return out
