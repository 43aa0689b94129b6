"""The market simulator's book (``venue/simulator.py``): persistent levels per side in integer ticks and
lots, kept around the fair price by makers, walked by takers and sweeps, snapshotted for the wire.
"""

from __future__ import annotations

import math

import numpy as np

from engine.events import BOOK_LEVELS
from venue.sim_model import _MAX_DEPTH, SimConfig, _Tape

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
