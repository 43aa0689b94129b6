"""A follower's cointegrated fair price in a multi-symbol simulated session (``venue/simulator.py``,
:class:`~venue.sim_model.PairConfig`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from venue.sim_contracts import _Units
from venue.sim_model import GRID_MS, PairConfig, SimConfig, _Chunk

# ---------------------------------------------------------------- a follower's cointegrated price


class _Pair:
    """A follower's fair price on the grid: ``log F = alpha + beta * log L + x``, where ``L`` is the
    leader's fair price (its latent price plus the impact of its own trades, as its book follows it)
    and the spread ``x`` is an Ornstein-Uhlenbeck process around ``mean``. Regime changes arrive as a
    Poisson process: a new ``beta`` (alpha moves so the price does not jump) and a new ``mean`` (the
    spread then reverts towards it). On top, ``y``: the drift of the follower's own order-flow signal,
    fading with ``own_tau_s`` (its imbalance leads its mid, as the leader's does)."""

    def __init__(
        self,
        pc: PairConfig,
        cfg: SimConfig,
        units: _Units,
        leader_units: _Units,
        leader_price: float,
        spread_rng: np.random.Generator,
        regime_rng: np.random.Generator,
        t0: int,
    ) -> None:
        dt = GRID_MS / 1000.0
        self.pc = pc
        self.kappa = math.log(2.0) / pc.half_life_s
        self.phi = math.exp(-self.kappa * dt)
        self.sd = pc.spread_sd_bps * 1e-4  # stationary
        self.step_sd = self.sd * math.sqrt(1.0 - self.phi * self.phi)
        fair0 = cfg.initial_mid_px * units.ticks_per_px
        self.drift = tuple(k * dt / fair0 for k in cfg.signal_drift_ticks_per_s)  # log units per step
        self.own_decay = math.exp(-dt / pc.own_tau_s)
        self.tick = 1.0 / units.ticks_per_px
        self.leader_tick = 1.0 / leader_units.ticks_per_px
        self.spread_rng = spread_rng
        self.regime_rng = regime_rng
        self.beta = pc.beta
        self.mean = 0.0
        self.alpha = math.log(cfg.initial_mid_px) - self.beta * math.log(leader_price)
        self.x = 0.0
        self.y = 0.0
        self.regimes: list[dict[str, float | int]] = []
        self._record(t0)
        self.next_ms = t0 + self._gap_ms()

    def _gap_ms(self) -> int:
        return 1 + int(self.regime_rng.exponential(self.pc.regime_mean_s * 1000.0))

    def _record(self, ms: int) -> None:
        self.regimes.append(
            {"start_ms": ms, "beta": self.beta, "alpha": self.alpha, "spread_mean": self.mean}
        )

    def _shift(self, ms: int, log_leader: float) -> None:
        lo, hi = self.pc.beta_range
        beta = lo + (hi - lo) * float(self.regime_rng.random())
        self.alpha += (self.beta - beta) * log_leader
        self.beta = beta
        self.mean = self.pc.mean_shift_bps * 1e-4 * float(self.regime_rng.standard_normal())
        self._record(ms)
        self.next_ms = ms + self._gap_ms()

    def chunk(self, chunk_start: int, ch: _Chunk, leader_ticks: list[float]) -> list[float]:
        """The follower's fair price in its own ticks at each grid step of the chunk."""
        n = len(ch.s)
        eps = self.spread_rng.standard_normal(n).tolist()
        out = [0.0] * n
        phi, step_sd, drift, lt, own = self.phi, self.step_sd, self.drift, self.leader_tick, self.own_decay
        s, regime = ch.s, ch.regime
        log, exp = math.log, math.exp
        x, y = self.x, self.y
        for j in range(n):
            lp = log(leader_ticks[j] * lt)
            ms = chunk_start + j * GRID_MS
            while ms >= self.next_ms:
                self._shift(self.next_ms, lp)
            out[j] = exp(self.alpha + self.beta * lp + x + y) / self.tick
            m = self.mean
            x = m + phi * (x - m) + step_sd * eps[j]
            y = own * y + drift[regime[j]] * s[j]
        self.x, self.y = x, y
        return out

    def truth(self, end_ms: int) -> dict[str, Any]:
        return {
            "model": "log(follower) = alpha + beta * log(leader) + spread + own; "
            "d spread = kappa * (spread_mean - spread) dt + sigma dW; own: the follower's own flow and "
            "impact, fading with own_tau_s",
            "own_tau_s": self.pc.own_tau_s,
            "half_life_s": self.pc.half_life_s,
            "kappa_per_s": self.kappa,
            "spread_sd": self.sd,
            "sigma_per_sqrt_s": self.sd * math.sqrt(2.0 * self.kappa),
            "regimes": [r for r in self.regimes if r["start_ms"] < end_ms],
        }
