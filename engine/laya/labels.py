"""Triple-barrier labels for Laya, each carrying the time it was decided (its horizon end).

For a book row ``t`` (time ``ts_ns[t]``, mid ``m_t``) the window is every later row ``j > t`` with
``ts_ns[j] <= ts_ns[t] + horizon_ns``. Three barriers bound it:

- upper ``m_t * (1 + lean_bps / 1e4)``, lower ``m_t * (1 - lean_bps / 1e4)``, vertical at
  ``ts_ns[t] + horizon_ns``.
- The first row that touches the upper (lower) barrier makes the label LEAN_BUY (LEAN_SELL); its time
  is the label's ``end_ns``. Nothing touched: HOLD, ``end_ns = ts_ns[t] + horizon_ns``.
- EMERGENCY overrides both: the mid moves ``emergency_bps`` or more from ``m_t`` (either direction: a
  two-sided quoter is run over on one side or the other) at some row ``e`` of the window *and* the
  move comes with a volume burst: the traded notional in ``(ts_ns[t], ts_ns[e]]`` per second is at
  least ``burst_ratio`` times the rate over the ``burst_lookback_ns`` before ``ts_ns[t]`` (clipped to
  the start of the data; with no history at all, any volume is a burst). ``end_ns = ts_ns[e]``.
  Without a trade stream the volume condition cannot be checked and is dropped (``trades=None``).

A row is labelled only when the data runs a full horizon past it (``ts_ns[-1] >= ts_ns[t] +
horizon_ns``), its mid is finite, and no excluded instant (a recorded gap) falls inside
``[ts_ns[t], ts_ns[t] + horizon_ns]``; other rows get ``valid = False`` and must not be trained on.

``end_ns`` is what purged walk-forward evaluation needs: a label's outcome depends on data in
``[ts_ns[t], end_ns]`` and on nothing later (the volume baseline looks back only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from engine.events import Label, Nanos

HOLD: Final = int(Label.HOLD)
LEAN_BUY: Final = int(Label.LEAN_BUY)
LEAN_SELL: Final = int(Label.LEAN_SELL)
EMERGENCY: Final = int(Label.EMERGENCY)
_NEVER: Final = np.iinfo(np.int64).max


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelConfig:
    """Barriers and the volume-burst rule. Thresholds in basis points of the mid, times in ns."""

    horizon_ns: Nanos = 2_000_000_000
    lean_bps: float = 1.5
    emergency_bps: float = 8.0
    burst_ratio: float = 2.0
    burst_lookback_ns: Nanos = 30_000_000_000

    def __post_init__(self) -> None:
        if self.horizon_ns <= 0:
            raise ValueError(f"horizon_ns must be > 0, got {self.horizon_ns}")
        if not 0.0 < self.lean_bps < self.emergency_bps < math.inf:
            raise ValueError(
                f"need 0 < lean_bps < emergency_bps, got lean_bps={self.lean_bps}, "
                f"emergency_bps={self.emergency_bps}"
            )
        if not self.burst_ratio >= 0.0:  # NaN too
            raise ValueError(f"burst_ratio must be >= 0, got {self.burst_ratio}")
        if self.burst_lookback_ns <= 0:
            raise ValueError(f"burst_lookback_ns must be > 0, got {self.burst_lookback_ns}")

    def to_json(self) -> dict[str, float | int]:
        return {
            "horizon_ns": int(self.horizon_ns),
            "lean_bps": float(self.lean_bps),
            "emergency_bps": float(self.emergency_bps),
            "burst_ratio": float(self.burst_ratio),
            "burst_lookback_ns": int(self.burst_lookback_ns),
        }


@dataclass(frozen=True, slots=True)
class Labels:
    """Per input row: ``label`` (``Label`` ids; HOLD where not valid), ``end_ns`` (when the label was
    decided; ``ts_ns`` where not valid), ``valid`` and ``move_bps`` (mid move at ``end_ns``, NaN where
    not valid)."""

    label: np.ndarray
    end_ns: np.ndarray
    valid: np.ndarray
    move_bps: np.ndarray


def _check_ts(name: str, ts: np.ndarray) -> None:
    if ts.size > 1 and np.any(np.diff(ts) < 0):
        bad = int(np.argmax(np.diff(ts) < 0))
        raise ValueError(
            f"{name} must be non-decreasing: {name}[{bad + 1}]={ts[bad + 1]} < {name}[{bad}]={ts[bad]}"
        )


def triple_barrier_labels(
    mid: np.ndarray,
    ts_ns: np.ndarray,
    config: LabelConfig,
    *,
    trade_ts_ns: np.ndarray | None = None,
    trade_notional: np.ndarray | None = None,
    exclude_ns: np.ndarray | None = None,
) -> Labels:
    """Label every row of one symbol's book series (see the module docstring).

    ``ts_ns`` non-decreasing (book rows in replay order); ``trade_ts_ns`` non-decreasing with
    ``trade_notional`` (px * sz) beside it, or both None; ``exclude_ns`` instants (e.g. gap times)
    that invalidate every label whose window contains them.
    """
    mid = np.asarray(mid, dtype=np.float64)
    ts = np.asarray(ts_ns, dtype=np.int64)
    if mid.ndim != 1 or mid.shape != ts.shape:
        raise ValueError(f"mid and ts_ns must be 1-d of equal length, got {mid.shape} and {ts.shape}")
    _check_ts("ts_ns", ts)
    if (trade_ts_ns is None) != (trade_notional is None):
        raise ValueError("pass trade_ts_ns and trade_notional together, or neither")
    n = mid.shape[0]
    label = np.full(n, HOLD, dtype=np.int64)
    end_ns = ts.copy()
    move_bps = np.full(n, np.nan, dtype=np.float64)
    if n == 0:
        return Labels(label, end_ns, np.zeros(0, dtype=bool), move_bps)

    horizon = int(config.horizon_ns)
    volume = (
        _Volume(trade_ts_ns, trade_notional, int(ts[0]))
        if trade_ts_ns is not None and trade_notional is not None
        else None
    )
    stop = np.searchsorted(ts, ts + horizon, side="right")  # window rows: t+1 .. stop-1
    valid = (ts[-1] >= ts + horizon) & np.isfinite(mid) & (mid > 0)
    if exclude_ns is not None and len(exclude_ns):
        ex = np.sort(np.asarray(exclude_ns, dtype=np.int64))
        hit = np.searchsorted(ex, ts + horizon, side="right") > np.searchsorted(ex, ts, side="left")
        valid &= ~hit

    up = mid * (1.0 + config.lean_bps / 1e4)
    down = mid * (1.0 - config.lean_bps / 1e4)
    e_up = mid * (1.0 + config.emergency_bps / 1e4)
    e_down = mid * (1.0 - config.emergency_bps / 1e4)
    first_lean = np.full(n, -1, dtype=np.int64)  # row of the first lean touch
    lean_dir = np.zeros(n, dtype=np.int64)
    # (rows, their emergency-size rows), offset by offset: earliest first
    emerg_rows: list[tuple[np.ndarray, np.ndarray]] = []

    rows = np.arange(n)
    max_k = int((stop - rows - 1).max())
    with np.errstate(invalid="ignore"):
        for k in range(1, max_k + 1):
            t = rows[(rows + k < stop) & valid]
            if t.size == 0:
                continue
            m = mid[t + k]
            open_ = first_lean[t] < 0
            hit_up = open_ & (m >= up[t])
            hit_dn = open_ & (m <= down[t]) & ~hit_up
            first_lean[t[hit_up]] = t[hit_up] + k
            lean_dir[t[hit_up]] = LEAN_BUY
            first_lean[t[hit_dn]] = t[hit_dn] + k
            lean_dir[t[hit_dn]] = LEAN_SELL
            big = (m >= e_up[t]) | (m <= e_down[t])
            if big.any():
                emerg_rows.append((t[big], t[big] + k))

    leaned = valid & (first_lean >= 0)
    label[leaned] = lean_dir[leaned]
    dec_row = np.where(leaned, first_lean, stop - 1)  # HOLD: the last row inside the horizon
    end_ns[valid] = ts[valid] + horizon
    end_ns[leaned] = ts[first_lean[leaned]]

    # EMERGENCY: the earliest emergency-size row of the window that comes with a volume burst.
    decided = np.zeros(n, dtype=bool)
    for t, e in emerg_rows:
        keep = ~decided[t]
        t, e = t[keep], e[keep]
        ok = volume.burst(ts[t], ts[e], config) if volume is not None else np.ones(t.size, dtype=bool)
        t, e = t[ok], e[ok]
        decided[t] = True
        label[t] = EMERGENCY
        end_ns[t] = ts[e]
        dec_row[t] = e

    idx = np.flatnonzero(valid)
    move_bps[idx] = (mid[dec_row[idx]] - mid[idx]) * 1e4 / mid[idx]
    return Labels(label, end_ns, valid, move_bps)


class _Volume:
    """Cumulative traded notional by time, for the burst rule."""

    def __init__(self, trade_ts_ns: np.ndarray, trade_notional: np.ndarray, data_start_ns: int) -> None:
        self.ts = np.asarray(trade_ts_ns, dtype=np.int64)
        _check_ts("trade_ts_ns", self.ts)
        notional = np.asarray(trade_notional, dtype=np.float64)
        if notional.shape != self.ts.shape:
            raise ValueError(f"trade_notional {notional.shape} does not match trade_ts_ns {self.ts.shape}")
        self.cum = np.concatenate([[0.0], np.cumsum(notional)])
        self.start_ns = min(data_start_ns, int(self.ts[0])) if self.ts.size else data_start_ns

    def upto(self, t_ns: np.ndarray) -> np.ndarray:
        """Notional traded at or before ``t_ns``."""
        return self.cum[np.searchsorted(self.ts, t_ns, side="right")]

    def burst(self, t0_ns: np.ndarray, t1_ns: np.ndarray, config: LabelConfig) -> np.ndarray:
        """Notional per second over ``(t0, t1]`` >= ``burst_ratio`` x the rate over the look-back."""
        fwd = self.upto(t1_ns) - self.upto(t0_ns)
        lb0 = np.maximum(t0_ns - int(config.burst_lookback_ns), self.start_ns)
        back = self.upto(t0_ns) - self.upto(lb0)
        fwd_s = np.maximum(t1_ns - t0_ns, 1) / 1e9
        back_s = (t0_ns - lb0) / 1e9
        back_rate = np.where(back_s > 0, back / np.where(back_s > 0, back_s, 1.0), 0.0)
        return (fwd > 0.0) & (fwd / fwd_s >= config.burst_ratio * back_rate)


def label_counts(label: np.ndarray, valid: np.ndarray | None = None) -> dict[str, int]:
    """Rows per class name (valid rows only when ``valid`` is given)."""
    y = label if valid is None else label[valid]
    return {lab.name: int((y == int(lab)).sum()) for lab in Label}
