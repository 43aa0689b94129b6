"""Deterministic Bitget v2 market simulator for USDT-M perpetuals: ``books15`` and ``trade`` pushes.

Same seed, same bytes: every draw comes from ``numpy.random.default_rng([seed, component])``, one
stream per component, nothing reads the wall clock. Prices are integer ticks of 0.1 and sizes
integer lots of 0.001 internally (in a multi-symbol session, each contract's tick and size step);
they become exchange strings (``"90000.1"``, ``"0.250"``) only on the wire, through
:func:`engine.venues.bitget_v2.encode_books15` / ``encode_trades``.

Model (exchange time, in chunks of 10 s on a 10 ms grid):

- **Latent state.** A two-state Markov regime (calm / bursty); an order-flow signal ``s`` (an
  Ornstein-Uhlenbeck process, stationary sd 1); a fair price ``f`` that diffuses with the regime's
  volatility, drifts with ``s`` and takes the permanent impact of trades and sweeps.
- **Flow.** Small taker orders arrive as a self-exciting (Hawkes-like) process whose base rate
  depends on the regime; their side leans with ``s``. Rare sweeps: blocks that walk several displayed
  levels, and liquidation-style orders that walk ~10 bps through the book (EMERGENCY-size moves);
  both excite the flow, widen the spread and often switch the regime to bursty.
- **Book.** Persistent levels (tick, a per-level lognormal size factor that wanders, quantity taken
  by trades that refills over time). Sizes are lognormal with a depth profile and tilted by ``s``
  (bids heavier when ``s > 0``), so displayed imbalance leads the mid. Makers keep ``f`` inside the
  spread: levels ``f`` has passed are lifted/hit by takers (trades) or cancelled, gaps are refilled
  towards a target spread that widens in bursts. Takers walk the same levels, so every trade is at
  the touch of the book as it stood, and a sweep prints one fill per level it consumed.
- **Wire.** A ``books15`` snapshot every 100-200 ms (jittered, median ~150 ms) with a rising ``seq``;
  a ``trade`` push per matching millisecond, newest first, rising ``tradeId``; the first trade push
  is a ``snapshot`` of recent trades (from a warm-up before ``start_ms``), then ``update``\\ s. Each
  push gets a receive time: push ts + lognormal feed latency, first in first out (one connection).
- **Several symbols** (:class:`MultiSim`): the first one leads; each other one's fair price follows
  it on a cointegrating relation, ``log F = alpha + beta * log L + spread``, the spread mean-reverting
  (Ornstein-Uhlenbeck) with regime changes of ``beta`` and of the spread's mean (:class:`PairConfig`).
  Every symbol has its own order flow, book and wire on its own contract (:data:`INSTRUMENTS`), and
  its own random streams. The true parameters go into the session's manifest.
"""

from __future__ import annotations

import heapq
import math
import re
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import numpy as np

from engine.bounds import check_seed
from engine.errors import DualhubError
from engine.events import BOOK_LEVELS
from engine.store import SessionWriter
from engine.venues.bitget_v2 import MS, Control, StreamCounters, decode, encode_books15, encode_trades

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


# ---------------------------------------------------------------- the book


class _Side:
    """One side, best level first. ``sign`` is +1 for bids (better = higher tick), -1 for asks.

    A level's size is set when it is created and re-quoted at each snapshot (depth profile, its own
    wandering factor ``xi``, the signal tilt); between snapshots only trades change it, so a taker
    walks exactly the sizes the last snapshot showed (plus levels quoted since).
    """

    __slots__ = ("sign", "ticks", "xi", "lots", "taken")

    def __init__(self, sign: int) -> None:
        self.sign = sign
        self.ticks: list[int] = []
        self.xi: list[float] = []  # per-level size factor, ~N(0, 1)
        self.lots: list[int] = []  # quoted size
        self.taken: list[float] = []  # lots taken by trades since, refilling over time

    def pop_best(self) -> None:
        del self.ticks[0], self.xi[0], self.lots[0], self.taken[0]

    def delete(self, i: int) -> None:
        del self.ticks[i], self.xi[i], self.lots[i], self.taken[i]

    def display(self, i: int) -> int:
        """Displayed lots at depth ``i``; <= 0 means the level has been taken."""
        return self.lots[i] - int(self.taken[i] + 0.5)


class _Market:
    """The simulated venue's book and matching; records fills as ``(ms, tick, lots, buy, trade_id)``.

    ``s`` is the current order-flow signal; the event loop sets it before each call.
    """

    def __init__(
        self, cfg: SimConfig, tape: _Tape, fair0: float, first_trade_id: int, first_seq: int
    ) -> None:
        self.cfg = cfg
        self.tape = tape
        self.s = 0.0
        self.bids = _Side(+1)
        self.asks = _Side(-1)
        self.impact = 0.0  # endogenous part of the fair price (trade impact, sweep jumps)
        self.trade_id = first_trade_id
        self.seq = first_seq
        self.fills: list[tuple[int, int, int, bool, int]] = []
        depth = np.arange(_MAX_DEPTH, dtype=np.float64)
        self._log_med = np.log(cfg.level_median_lots * (1.0 + cfg.level_depth_growth * depth)).tolist()
        self._tilt = (cfg.imbalance_gain * (0.5 + 0.5 * np.exp(-depth / 5.0))).tolist()
        self._gap = (cfg.level_gap_ticks[0] + cfg.level_gap_ticks[1] * depth).tolist()
        b = math.floor(fair0)
        self._build(self.bids, b)
        self._build(self.asks, b + 1)

    # -- levels

    def _size(self, sign: int, depth: int, xi: float) -> int:
        d = depth if depth < _MAX_DEPTH else _MAX_DEPTH - 1
        lots = int(
            math.exp(self._log_med[d] + self.cfg.level_size_sigma * xi + sign * self._tilt[d] * self.s) + 0.5
        )
        return lots if lots > 0 else 1

    def _gap_ticks(self, depth: int) -> int:
        return 1 + int(-math.log(1.0 - self.tape.u()) * self._gap[min(depth, _MAX_DEPTH - 1)])

    def _push_level(self, side: _Side, tick: int) -> None:
        xi = self.tape.n()
        side.lots.append(self._size(side.sign, len(side.ticks), xi))
        side.ticks.append(tick)
        side.xi.append(xi)
        side.taken.append(0.0)
        self.seq += 1

    def _build(self, side: _Side, best: int) -> None:
        """Fill an empty side from ``best`` outwards."""
        self._push_level(side, best)
        self._extend(side)

    def _extend(self, side: _Side) -> None:
        t = side.ticks
        while len(t) < self.cfg.book_levels_kept:
            self._push_level(side, t[-1] - side.sign * self._gap_ticks(len(t)))

    def _improve(self, side: _Side, target: int, refill_prob: float) -> None:
        """Makers quote at ``target`` (and fill towards the old best) if it is better than the best."""
        t = side.ticks
        if not t:
            self._build(side, target)
            return
        sign = side.sign
        best = t[0]
        if sign * (target - best) <= 0 or self.tape.u() >= refill_prob:
            return
        new = [target]
        keep = self.cfg.book_levels_kept
        while len(new) < keep:
            nt = new[-1] - sign * self._gap_ticks(len(new))
            if sign * (nt - best) <= 0:
                break
            new.append(nt)
        xi = [self.tape.n() for _ in new]
        lots = [self._size(sign, i, x) for i, x in enumerate(xi)]
        self.seq += len(new)
        if len(new) >= keep:
            side.ticks, side.xi, side.lots, side.taken = new, xi, lots, [0.0] * len(new)
            return
        t[:0] = new
        side.xi[:0] = xi
        side.lots[:0] = lots
        side.taken[:0] = [0.0] * len(new)
        extra = len(t) - keep - 10
        if extra > 0:
            del t[-extra:], side.xi[-extra:], side.lots[-extra:], side.taken[-extra:]

    # -- trading

    def _fill(self, ms: int, tick: int, lots: int, buy: bool) -> None:
        self.trade_id += 1 + int(self.tape.u() * 4.0)
        self.fills.append((ms, tick, lots, buy, self.trade_id))
        self.seq += 1

    def take(self, buy: bool, lots: int, ms: int) -> tuple[int, int]:
        """A taker order of ``lots`` walks the opposite side; returns (levels emptied, last tick)."""
        side = self.asks if buy else self.bids
        left = lots
        emptied = 0
        last = side.ticks[0]
        while left > 0:
            if not side.ticks:
                self._build(side, last - side.sign * self._gap_ticks(0))
            d = side.display(0)
            last = side.ticks[0]
            if d <= 0:
                side.pop_best()
                continue
            q = d if d < left else left
            self._fill(ms, last, q, buy)
            left -= q
            if q == d:
                side.pop_best()
                emptied += 1
            else:
                side.taken[0] += q
        return emptied, last

    def sweep_levels(self, buy: bool, n_levels: int, frac: float, ms: int) -> int:
        """A block that takes ``n_levels`` displayed levels and ``frac`` of the next; returns last tick."""
        side = self.asks if buy else self.bids
        self._extend(side)
        n = min(n_levels, len(side.ticks) - 1)
        total = sum(max(0, side.display(i)) for i in range(n)) + int(frac * max(0, side.display(n)))
        if total <= 0:
            return side.ticks[0]
        return self.take(buy, total, ms)[1]

    def sweep_to(self, buy: bool, move_ticks: int, ms: int) -> int:
        """A liquidation-style order that takes every level up to ``move_ticks`` through the touch."""
        side = self.asks if buy else self.bids
        sign = side.sign
        target = side.ticks[0] - sign * move_ticks
        spacing = max(1.0, move_ticks / self.cfg.liquidation_fills)
        last = side.ticks[0]
        while True:
            if not side.ticks:
                nt = last - sign * (1 + int(-math.log(1.0 - self.tape.u()) * spacing))
                self._push_level(side, nt)
            tick = side.ticks[0]
            if sign * (tick - target) < 0:
                break
            d = side.display(0)
            if d > 0:
                self._fill(ms, tick, d, buy)
            side.pop_best()
            last = tick
        self._extend(side)
        return last

    # -- makers

    def sync(self, ms: int, fair: float, spread: int, bursty: bool) -> None:
        """Bring the book in line with the fair price at ``ms``: passed levels are taken or cancelled,
        tight spreads are pulled in bursts, gaps at the touch refill towards the target spread."""
        cfg = self.cfg
        tape = self.tape
        m = cfg.hysteresis_ticks
        for side in (self.asks, self.bids):
            t = side.ticks
            sign = side.sign
            while t and sign * (t[0] - fair) > m:
                d = side.display(0)
                if d > 0 and tape.u() < cfg.lift_prob:
                    self._fill(ms, t[0], d, sign < 0)
                else:
                    self.seq += 1
                side.pop_best()
        if bursty and self.bids.ticks and self.asks.ticks:
            if self.asks.ticks[0] - self.bids.ticks[0] < spread and tape.u() < cfg.pull_prob:
                side = self.asks if tape.u() < 0.5 else self.bids
                if len(side.ticks) > 1:
                    side.pop_best()
                    self.seq += 1
        refill = cfg.refill_prob[1 if bursty else 0]
        ask_target = math.floor(fair + spread / 2.0 + 0.5)
        if self.bids.ticks:
            ask_target = max(ask_target, self.bids.ticks[0] + 1)
        self._improve(self.asks, ask_target, refill)
        bid_target = min(math.floor(fair - spread / 2.0 + 0.5), self.asks.ticks[0] - 1)
        self._improve(self.bids, bid_target, refill)
        self._extend(self.asks)
        self._extend(self.bids)

    def snapshot(self, dt_ms: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Age the book by ``dt_ms`` (refills, re-quoted sizes) and return 15 (tick, lots) per side."""
        cfg = self.cfg
        tape = self.tape
        refill = math.exp(-dt_ms / (1000.0 * cfg.refill_tau_s))
        rho = math.exp(-dt_ms / (1000.0 * cfg.level_size_tau_s))
        rho_sd = math.sqrt(1.0 - rho * rho)
        out = []
        for side in (self.bids, self.asks):
            xi, lots, taken, sign = side.xi, side.lots, side.taken, side.sign
            for i in range(len(xi)):
                x = rho * xi[i] + rho_sd * tape.n()
                xi[i] = x
                lots[i] = self._size(sign, i, x)
                taken[i] *= refill
            self.seq += len(xi)
            levels: list[tuple[int, int]] = []
            i = 0
            while len(levels) < BOOK_LEVELS:
                if i >= len(side.ticks):
                    self._extend(side)
                d = side.display(i)
                if d <= 0 and len(side.ticks) == 1:
                    taken[i] = 0.0  # never empty a side: the last level has refilled
                    d = side.display(i)
                if d <= 0:  # fully taken and not refilled: the level is gone
                    side.delete(i)
                    continue
                levels.append((side.ticks[i], d))
                i += 1
            out.append(levels)
        return out[0], out[1]


# ---------------------------------------------------------------- contracts and wire


@dataclass(frozen=True, slots=True, kw_only=True)
class Instrument:
    """A simulated contract: tick and size step as exchange strings, and its typical price level."""

    tick: str
    size_step: str
    price: float


# Tick and size step of Bitget's USDT-M perpetuals. BTCUSDT: pricePlace 1 (docs/bitget-v2.md) and the
# engine's default contract; ETHUSDT and SOLUSDT: 2 and 3 price decimals, DOGEUSDT 6 and whole coins
# (volumePlace 0), as Bitget's product list in ../shared/data/real/bitget-v1/BITGET.0 gives them.
# BTCUSDT's price is SimConfig's initial_mid_px, so a BTCUSDT leader runs the single-symbol model
# unchanged.
INSTRUMENTS: Final[Mapping[str, Instrument]] = MappingProxyType(
    {
        "BTCUSDT": Instrument(tick="0.1", size_step="0.001", price=90_000.0),
        "ETHUSDT": Instrument(tick="0.01", size_step="0.01", price=3_000.0),
        "SOLUSDT": Instrument(tick="0.001", size_step="0.1", price=150.0),
        "DOGEUSDT": Instrument(tick="0.000001", size_step="1", price=0.2),
    }
)
_SYMBOL_RE: Final = re.compile(r"^[A-Z0-9]{2,40}$")
# SimConfig fields in ticks that describe price *moves* (scaled with the price level, so moves keep
# their size in bps) and in lots (scaled so a lot keeps its notional); spreads, gaps and hysteresis
# stay in ticks: they are set by the tick, whatever the price.
_MOVE_FIELDS: Final = (
    "fair_vol_ticks_per_sqrt_s",
    "signal_drift_ticks_per_s",
    "trade_impact_ticks",
    "level_impact_ticks",
    "liquidation_median_ticks",
)
_LOT_FIELDS: Final = ("trade_median_lots", "level_median_lots", "trade_max_lots")


def _decimals(text: str) -> tuple[int, int]:
    """``"0.01"`` -> (2, 1): the step is ``unit`` in units of 10**-dp."""
    d = Decimal(text).normalize()
    if not d.is_finite() or d <= 0:
        raise ValueError(f"a tick or size step must be a positive decimal, got {text!r}")
    dp = max(0, -int(d.as_tuple().exponent))
    return dp, int(d.scaleb(dp))


def _formatter(text: str) -> Callable[[int], str]:
    """Integer steps -> the exchange string (``"90000.1"``, ``"0.250"``): every decimal of the step."""
    dp, unit = _decimals(text)
    if dp == 0:
        return lambda n: str(n * unit)
    p = 10**dp

    def fmt(n: int) -> str:
        v = n * unit
        return f"{v // p}.{v % p:0{dp}d}"

    return fmt


class _Units:
    """One contract's integer model units: prices in ticks, sizes in lots."""

    __slots__ = ("ticks_per_px", "lots_per_unit", "px", "sz")

    def __init__(self, tick: str, size_step: str) -> None:
        pdp, punit = _decimals(tick)
        sdp, sunit = _decimals(size_step)
        self.ticks_per_px = 10**pdp / punit
        self.lots_per_unit = 10**sdp / sunit
        self.px = _formatter(tick)
        self.sz = _formatter(size_step)


_DEFAULT_UNITS: Final = _Units("0.1", "0.001")  # SimConfig's: TICKS_PER_PX, LOTS_PER_UNIT


def _instrument_config(cfg: SimConfig, inst: Instrument, units: _Units) -> SimConfig:
    """``cfg`` describes a contract of tick 0.1 and size step 0.001 at ``initial_mid_px``; the same
    market on ``inst``: moves keep their size in bps, a lot its notional."""
    move = inst.price * units.ticks_per_px / (cfg.initial_mid_px * TICKS_PER_PX)
    lot = (cfg.initial_mid_px / LOTS_PER_UNIT) / (inst.price / units.lots_per_unit)
    if move == 1.0 and lot == 1.0:
        return cfg
    changes: dict[str, Any] = {"initial_mid_px": inst.price}
    for name in _MOVE_FIELDS:
        v = getattr(cfg, name)
        changes[name] = tuple(x * move for x in v) if isinstance(v, tuple) else v * move
    for name in _LOT_FIELDS:
        v = getattr(cfg, name)
        changes[name] = max(1, round(v * lot)) if isinstance(v, int) else v * lot
    return replace(cfg, **changes)


def _trade_rows(fills: list[tuple[int, int, int, bool, int]], units: _Units) -> list[dict[str, str]]:
    """Bitget order: newest first."""
    px, sz = units.px, units.sz
    return [
        {"ts": str(ms), "price": px(t), "size": sz(q), "side": "buy" if b else "sell", "tradeId": str(i)}
        for ms, t, q, b, i in reversed(fills)
    ]


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


# ---------------------------------------------------------------- one symbol's frames


# A frame before receive times: (push_ms, event_ms, kind, gen, raw). kind 0 trade, 1 book.
_Frame = tuple[int, int, int, int, bytes]


class _SymbolSim:
    """One symbol's market and wire, a 10 s chunk at a time (:meth:`chunks`).

    ``index`` 0 draws from ``[seed, component]`` (a single-symbol session's streams), symbol ``k`` of
    a multi-symbol session from ``[seed, component, k]``. A leader (``record_path``) keeps its fair
    price at the start of each grid step of the last chunk in :attr:`path`; a follower (``pair``) reads
    the leader's from :attr:`leader` before each chunk.
    """

    def __init__(
        self,
        symbol: str,
        cfg: SimConfig,
        *,
        seed: int,
        index: int,
        start_ms: int,
        end_ms: int,
        units: _Units,
        pair: _Pair | None = None,
        record_path: bool = False,
    ) -> None:
        self.symbol, self.cfg, self.seed, self.index = symbol, cfg, seed, index
        self.start_ms, self.end_ms, self.units = start_ms, end_ms, units
        self.pair = pair
        self.record_path = record_path
        self.path: list[float] = []
        self.leader: list[float] = []

    def chunks(self) -> Iterator[list[tuple[int, bytes]]]:
        """Per chunk, the (ts_recv_ns, raw) of the frames whose receive time is now known."""
        cfg, symbol, seed, k, units = self.cfg, self.symbol, self.seed, self.index, self.units
        start_ms, end_ms, pair = self.start_ms, self.end_ms, self.pair
        t0 = start_ms - cfg.warmup_ms
        latent_rng = _rng(seed, _RNG_LATENT, k)
        flow = _rng(seed, _RNG_FLOW, k)
        wire = _Tape(_rng(seed, _RNG_WIRE, k))
        feed = _Tape(_rng(seed, _RNG_FEED, k))
        book_tape = _Tape(_rng(seed, _RNG_BOOK, k))
        fair0 = cfg.initial_mid_px * units.ticks_per_px
        latent = _Latent(regime=_CALM, s=0.0, excite=0.0, stress=0.0, fair=fair0)
        mkt = _Market(
            cfg,
            book_tape,
            fair0,
            first_trade_id=1_390_000_000_000_000_000 + int(wire.u() * 1e15),
            first_seq=400_000_000_000 + int(wire.u() * 1e10),
        )
        recent: deque[tuple[int, int, int, bool, int]] = deque(maxlen=cfg.trade_snapshot_len)
        subscribed = False
        frames: list[_Frame] = []  # waiting for their receive time
        gen = 0
        last_trade_push = 0
        recv_ns = 0
        lat_mu = math.log(cfg.feed_latency_median_ms * MS)
        book_lo, book_hi = cfg.book_interval_ms
        next_book = t0 + book_lo
        last_book = t0
        group: list[tuple[int, int, int, bool, int]] = []
        gain, sgain = cfg.flow_side_gain, cfg.sweep_side_gain
        px, sz = units.px, units.sz
        # A follower's own impact fades (PairConfig.own_tau_s): the pair stays cointegrated.
        impact_decay_per_ms = 1.0 / (1000.0 * pair.pc.own_tau_s) if pair is not None else 0.0
        last_ms = t0

        def trade_frame(fills: list[tuple[int, int, int, bool, int]], action: str, push_ms: int) -> None:
            nonlocal gen
            raw = encode_trades(symbol, _trade_rows(fills, units), push_ts_ms=push_ms, action=action)
            frames.append((push_ms, fills[-1][0], 0, gen, raw))
            gen += 1

        def flush_group() -> None:
            nonlocal subscribed, last_trade_push
            if not group:
                return
            ms = group[0][0]
            push = max(last_trade_push, ms + int(wire.u() * (cfg.trade_push_delay_ms + 1)))
            last_trade_push = push
            trade_frame(group, "update" if subscribed else "snapshot", push)
            subscribed = True
            group.clear()

        chunk_start = t0
        done = False
        while not done:
            ch = _latent_chunk(cfg, latent_rng, latent, CHUNK_STEPS)
            base = ch.fair if pair is None else pair.chunk(chunk_start, ch, self.leader)
            impact_at = [0.0] * CHUNK_STEPS if self.record_path else None
            filled = 0
            chunk_end = chunk_start + CHUNK_STEPS * GRID_MS
            # Small taker orders: time within the grid step, side, size.
            counts = np.asarray(ch.trades, dtype=np.int64)
            steps = np.repeat(np.arange(CHUNK_STEPS, dtype=np.int64), counts)
            m = steps.size
            t_ms = chunk_start + steps * GRID_MS + flow.integers(0, GRID_MS, m)
            p_buy = 1.0 / (1.0 + np.exp(-gain * np.asarray(ch.s)[steps]))
            t_buy = (flow.random(m) < p_buy).tolist()
            t_lots = np.clip(
                np.rint(cfg.trade_median_lots * np.exp(cfg.trade_size_sigma * flow.standard_normal(m))),
                1,
                cfg.trade_max_lots,
            ).astype(np.int64)
            # Sweeps: time, side, kind and size.
            sw = np.asarray(ch.sweeps, dtype=np.int64)
            n_sw = sw.size
            sw_ms = chunk_start + sw * GRID_MS + flow.integers(0, GRID_MS, n_sw)
            sw_buy = (flow.random(n_sw) < 1.0 / (1.0 + np.exp(-sgain * np.asarray(ch.s)[sw]))).tolist()
            sw_liq = (flow.random(n_sw) < cfg.liquidation_share).tolist()
            sw_move = np.rint(
                cfg.liquidation_median_ticks * np.exp(cfg.liquidation_sigma * flow.standard_normal(n_sw))
            ).astype(np.int64)
            sw_levels = 1 + flow.geometric(cfg.block_levels_p, n_sw)
            sw_frac = flow.random(n_sw).tolist()
            # Book snapshot times.
            b_ms = []
            while next_book < chunk_end:
                b_ms.append(next_book)
                span = book_hi - book_lo + 1
                next_book += book_lo + int((wire.u() + wire.u()) * 0.5 * span)
            # All events of the chunk in time order; at equal ms trades, then sweeps, then the snapshot.
            ev_ms = np.concatenate([t_ms, sw_ms, np.asarray(b_ms, dtype=np.int64)])
            ev_kind = np.concatenate(
                [np.zeros(m, np.int64), np.ones(n_sw, np.int64), np.full(len(b_ms), 2, np.int64)]
            )
            ev_idx = np.concatenate([np.arange(m), np.arange(n_sw), np.arange(len(b_ms))]).astype(np.int64)
            order = np.lexsort((ev_idx, ev_kind, ev_ms))
            ev_ms_l, ev_kind_l, ev_idx_l = (
                ev_ms[order].tolist(),
                ev_kind[order].tolist(),
                ev_idx[order].tolist(),
            )
            t_lots_l, sw_move_l, sw_levels_l = t_lots.tolist(), sw_move.tolist(), sw_levels.tolist()

            for ms, kind, idx in zip(ev_ms_l, ev_kind_l, ev_idx_l, strict=True):
                if ms >= end_ms:
                    done = True
                    break
                if not subscribed and ms >= start_ms:
                    if recent:
                        trade_frame(list(recent), "snapshot", start_ms)
                        subscribed = True
                        last_trade_push = start_ms
                j = (ms - chunk_start) // GRID_MS
                if impact_at is not None and filled <= j:
                    impact_at[filled : j + 1] = [mkt.impact] * (j + 1 - filled)
                    filled = j + 1
                if impact_decay_per_ms:
                    mkt.impact *= math.exp(-impact_decay_per_ms * (ms - last_ms))
                    last_ms = ms
                fair = base[j] + mkt.impact
                bursty = ch.regime[j] == _BURSTY
                spread = 1 + int(cfg.spread_base[ch.regime[j]] + ch.stress[j] + book_tape.u())
                mkt.s = ch.s[j]
                mkt.sync(ms, fair, spread, bursty)
                if kind == 0:
                    buy = t_buy[idx]
                    emptied, _ = mkt.take(buy, t_lots_l[idx], ms)
                    d = 1.0 if buy else -1.0
                    mkt.impact += d * (cfg.trade_impact_ticks + cfg.level_impact_ticks * emptied)
                elif kind == 1:
                    buy = sw_buy[idx]
                    if sw_liq[idx]:
                        last = mkt.sweep_to(buy, sw_move_l[idx], ms)
                    else:
                        last = mkt.sweep_levels(buy, sw_levels_l[idx], sw_frac[idx], ms)
                    mkt.impact = last - base[j]  # the fair price moves to where the sweep stopped
                else:
                    bids, asks = mkt.snapshot(ms - last_book)
                    last_book = ms
                    if ms >= start_ms:
                        push = ms + int(wire.u() * (cfg.book_push_delay_ms + 1))
                        raw = encode_books15(
                            symbol,
                            ts_ms=ms,
                            seq=mkt.seq,
                            bids=[(px(t), sz(q)) for t, q in bids],
                            asks=[(px(t), sz(q)) for t, q in asks],
                            push_ts_ms=push,
                        )
                        frames.append((push, ms, 1, gen, raw))
                        gen += 1
                if mkt.fills:
                    new, mkt.fills = mkt.fills, []
                    if ms < start_ms:
                        recent.extend(new)
                    else:
                        if group and group[0][0] != ms:
                            flush_group()
                        group.extend(new)
            flush_group()  # a matching millisecond never spans two chunks
            if impact_at is not None:
                impact_at[filled:] = [mkt.impact] * (CHUNK_STEPS - filled)
                self.path = [f + i for f, i in zip(ch.fair, impact_at, strict=True)]
            chunk_start = chunk_end

            # Frames pushed before chunk_end can no longer be overtaken: give them receive times.
            frames.sort(key=lambda f: f[:4])
            cut = (
                len(frames)
                if done
                else next((i for i, f in enumerate(frames) if f[0] >= chunk_end), len(frames))
            )
            out = []
            for push_ms, _, _, _, raw in frames[:cut]:
                lat_ns = int(math.exp(lat_mu + cfg.feed_latency_sigma * feed.n()))
                recv_ns = max(recv_ns, push_ms * MS + lat_ns)
                out.append((recv_ns, raw))
            del frames[:cut]
            yield out


def _end_ms(start_ms: int, minutes: float) -> int:
    if not (minutes > 0 and math.isfinite(minutes)):
        raise ValueError(f"minutes must be a finite number > 0, got {minutes}")
    return start_ms + round(minutes * 60_000)


def generate_frames(
    *,
    symbol: str = "BTCUSDT",
    minutes: float = 10.0,
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    config: SimConfig | None = None,
) -> Iterator[tuple[int, bytes]]:
    """(ts_recv_ns, raw frame bytes) of one symbol, in receive order.

    Covers exchange time ``[start_ms, start_ms + minutes)``; the model runs ``config.warmup_ms``
    earlier so the first trade push can be the snapshot of recent trades Bitget sends after
    subscribing. Generated lazily in 10 s chunks (memory stays flat for long sessions), and a
    shorter session's frames are a prefix of a longer one's with the same seed and ``start_ms``.
    ``config`` (default :class:`SimConfig`) holds the model parameters, whose tick (0.1) and size step
    (0.001) hold whatever ``symbol`` is called. Several symbols, each on its own contract: :class:`MultiSim`.
    """
    cfg = config or SimConfig()
    end_ms = _end_ms(start_ms, minutes)
    sim = _SymbolSim(symbol, cfg, seed=seed, index=0, start_ms=start_ms, end_ms=end_ms, units=_DEFAULT_UNITS)
    for out in sim.chunks():
        yield from out


def check_symbols(
    symbols: Sequence[str], instruments: Mapping[str, Instrument] | None = None
) -> tuple[str, ...]:
    """The symbols of a simulated session, or a one-line :class:`DualhubError`: upper-case names, no
    repeats, and, for more than one, each a contract of ``instruments`` (default :data:`INSTRUMENTS`)."""
    syms = tuple(symbols)
    if not syms:
        raise DualhubError("no symbols given")
    for s in syms:
        if not isinstance(s, str) or not _SYMBOL_RE.match(s):
            raise DualhubError(f"bad symbol {s!r}: upper-case letters and digits, e.g. BTCUSDT")
    if dup := sorted({s for s in syms if syms.count(s) > 1}):
        raise DualhubError(f"symbol {dup[0]} is given twice")
    table = INSTRUMENTS if instruments is None else instruments
    if len(syms) > 1 and (unknown := [s for s in syms if s not in table]):
        raise DualhubError(
            f"no simulated contract for {', '.join(unknown)}; a multi-symbol session knows {', '.join(table)}"
        )
    return syms


class MultiSim:
    """Several symbols in one session: the first leads, each other one is cointegrated with it
    (:class:`PairConfig`, ``config.pair``), each on its own contract (tick, size step, price level from
    ``instruments``, default :data:`INSTRUMENTS`).

    :meth:`frames` yields every symbol's (ts_recv_ns, raw) merged by (ts_recv, symbol's place in
    ``symbols``, its own order): each symbol's feed has its own receive times, as on its own connection.
    One symbol is :func:`generate_frames` exactly (any name, SimConfig's contract); a BTCUSDT leader's
    frames are those of the single-symbol session with the same seed. :meth:`truth` holds each pair's
    true parameters and regime changes (complete once :meth:`frames` is exhausted).
    """

    def __init__(
        self,
        symbols: Sequence[str],
        *,
        minutes: float = 10.0,
        seed: int = 7,
        start_ms: int = DEFAULT_START_MS,
        config: SimConfig | None = None,
        instruments: Mapping[str, Instrument] | None = None,
    ) -> None:
        self.symbols = check_symbols(symbols, instruments)
        check_seed(seed)
        table = INSTRUMENTS if instruments is None else instruments
        cfg = config or SimConfig()
        self.seed, self.minutes, self.start_ms = seed, minutes, start_ms
        self.end_ms = _end_ms(start_ms, minutes)
        t0 = start_ms - cfg.warmup_ms
        common = {"seed": seed, "start_ms": start_ms, "end_ms": self.end_ms}
        if len(self.symbols) == 1:
            self.instruments: dict[str, Instrument] = {}
            self.sims = [_SymbolSim(self.symbols[0], cfg, index=0, units=_DEFAULT_UNITS, **common)]
            self.pairs: list[_Pair] = []
            return
        self.instruments = {s: table[s] for s in self.symbols}
        lead = self.instruments[self.symbols[0]]
        lead_units = _Units(lead.tick, lead.size_step)
        self.sims = [
            _SymbolSim(
                self.symbols[0],
                _instrument_config(cfg, lead, lead_units),
                index=0,
                units=lead_units,
                record_path=True,
                **common,
            )
        ]
        self.pairs = []
        for k, s in enumerate(self.symbols[1:], start=1):
            inst = self.instruments[s]
            units = _Units(inst.tick, inst.size_step)
            scfg = _instrument_config(cfg, inst, units)
            pair = _Pair(
                cfg.pair,
                scfg,
                units,
                lead_units,
                lead.price,
                _rng(seed, _RNG_SPREAD, k),
                _rng(seed, _RNG_PAIR, k),
                t0,
            )
            self.pairs.append(pair)
            self.sims.append(_SymbolSim(s, scfg, index=k, units=units, pair=pair, **common))

    def frames(self) -> Iterator[tuple[int, bytes]]:
        gens = [sim.chunks() for sim in self.sims]
        if len(gens) == 1:
            for out in gens[0]:
                yield from out
            return
        leader = self.sims[0]
        live = [True] * len(gens)
        heap: list[tuple[int, int, int, bytes]] = []
        seen = [0] * len(gens)
        chunk_end = self.start_ms - self.sims[0].cfg.warmup_ms
        while any(live):
            chunk_end += CHUNK_STEPS * GRID_MS
            for k, g in enumerate(gens):
                if not live[k]:
                    continue
                if k:
                    # Past the leader's last chunk every follower event is past the end: any path serves.
                    self.sims[k].leader = leader.path if live[0] else [leader.path[-1]] * CHUNK_STEPS
                try:
                    out = next(g)
                except StopIteration:
                    live[k] = False
                    continue
                for ts, raw in out:
                    heapq.heappush(heap, (ts, k, seen[k], raw))
                    seen[k] += 1
            # Every later frame is pushed at or after chunk_end, so received after it.
            bound = chunk_end * MS if any(live) else None
            while heap and (bound is None or heap[0][0] < bound):
                ts, _, _, raw = heapq.heappop(heap)
                yield ts, raw

    def truth(self) -> dict[str, Any]:
        """What the notebook compares estimates with: the contracts and each pair's true parameters."""
        if not self.pairs:
            return {}
        lead = self.symbols[0]
        return {
            "leader": lead,
            "instruments": {
                s: {"tick": i.tick, "size_step": i.size_step, "price": i.price}
                for s, i in self.instruments.items()
            },
            "pairs": [
                {"leader": lead, "follower": s, **p.truth(self.end_ms)}
                for s, p in zip(self.symbols[1:], self.pairs, strict=True)
            ],
        }


def simulate_session(
    out_dir: Path | str,
    *,
    symbol: str = "BTCUSDT",
    symbols: Sequence[str] | None = None,
    minutes: float = 10.0,
    seed: int = 7,
    start_ms: int = DEFAULT_START_MS,
    progress: bool = False,
    config: SimConfig | None = None,
) -> Path:
    """Write a finished session: frames -> engine.venues.bitget_v2.decode (the same normalisation the
    recorder uses) -> engine.store.SessionWriter(source="simulator", symbols=...,
    extra={"simulator": {"seed", "minutes", "symbol", "start_ms"}}).

    ``symbols`` (two or more): a :class:`MultiSim` session; the ``simulator`` entry then has
    ``symbols`` instead of ``symbol``, plus :meth:`MultiSim.truth` (leader, instruments, pairs).
    Control frames returned by decode are ignored; Quarantined records are written too (there should
    be none). With progress=True show a rich progress bar. Returns out_dir."""
    syms = (symbol,) if symbols is None else tuple(symbols)
    sim = MultiSim(syms, minutes=minutes, seed=seed, start_ms=start_ms, config=config)
    if len(sim.symbols) == 1:
        meta: dict[str, Any] = {
            "seed": seed,
            "minutes": minutes,
            "symbol": sim.symbols[0],
            "start_ms": start_ms,
        }
    else:
        meta = {"seed": seed, "minutes": minutes, "symbols": list(sim.symbols), "start_ms": start_ms}
    out = Path(out_dir)
    writer = SessionWriter(out, source="simulator", symbols=sim.symbols, extra={"simulator": meta})
    counters = StreamCounters()
    bar: Any = None
    total_ms = round(minutes * 60_000)
    if progress and sys.stdout.isatty():  # piped, a bar draws nothing but a blank line
        from rich.progress import BarColumn, Progress, TimeRemainingColumn

        bar = Progress("[bold]simulate", BarColumn(), "{task.percentage:>3.0f}%", TimeRemainingColumn())
        bar.start()
        task = bar.add_task("simulate", total=total_ms)
    try:
        for i, (ts_recv, raw) in enumerate(sim.frames()):
            for ev in decode(raw, ts_recv, counters):
                if not isinstance(ev, Control):
                    writer.add(ev)
            if bar is not None and i % 256 == 0:
                bar.update(task, completed=min(total_ms, ts_recv // MS - start_ms))
        writer.extra["simulator"] = {**meta, **sim.truth()}
        writer.close()
    finally:
        if bar is not None:
            bar.update(task, completed=total_ms)
            bar.stop()
    return out
