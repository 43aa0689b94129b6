"""The pairs hub's hedge ratio against the truth, in the Portfolio section of a run's report.

The hub fits each configured pair online (:mod:`engine.kev.pairs`, ``pair_update``) on both legs' mids
at every book of either leg; the run's log keeps only the hedge ratio each command carried. The fit is
therefore re-run here by the hub's own functions over the run's books (each leg's latest finite mid,
in receive order: the engine's observations with the recorded feed latency), with the run's
``pair_half_life_ms``, giving the estimate and its standard error (``pair_beta_se``) over time.

- A simulated session knows the true beta of each regime (its manifest's ``simulator.pairs``):
  :func:`regime_section` gives, per pair and regime, the estimate at the regime's end against the
  truth (the error, relative), the regime's length in half-lives (``long``: at least
  :data:`LONG_HALF_LIVES`, where the estimate should be within :data:`BOUND`), Kev's last commanded
  hedge ratio in it and the rolling realised beta then.
- Recorded data has no truth: :func:`rolling_section` compares the estimate with the rolling OLS
  beta of 1 s log returns (views.sql ``pair_beta``) and its 95% confidence band (+-1.96 se).

:func:`figure` draws both over time. ``bench/bench_pair_beta.py`` measures the same fit over seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

import duckdb
import numpy as np

from analysis.report import Section
from engine.kev.pairs import pair_beta_se, pair_series, pair_state

LONG_HALF_LIVES: Final = 3.0  # a regime this long (in the fit's half-lives) should be fitted within BOUND
BOUND: Final = 0.05
Z95: Final = 1.96
DEFAULT_HALF_LIFE_MS: Final = 60_000  # engine config's pair_half_life_ms when a run's config has none

Pair = tuple[str, str]


@dataclass
class PairFit:
    leader: str
    follower: str
    half_life_ns: float
    ts: np.ndarray  # every observation (ns)
    beta: np.ndarray  # the fit after it
    se_ts: np.ndarray  # where the standard error was read (every sample and regime end)
    se: np.ndarray
    regimes: list[tuple[int, int | None, float]]  # (start_ns, end_ns or None, true beta); [] when recorded
    rolling: dict[str, np.ndarray] = field(default_factory=dict)  # t_ns, beta_returns, beta_returns_se
    commands: dict[str, np.ndarray] = field(default_factory=dict)  # ts_recv, hedge_ratio (Kev's)

    def at(self, t_ns: float) -> tuple[float, float]:
        """The estimate and its standard error at ``t_ns`` (the last reading at or before; NaN before)."""
        j = int(np.searchsorted(self.ts, t_ns, side="right")) - 1
        k = int(np.searchsorted(self.se_ts, t_ns, side="right")) - 1
        return (float(self.beta[j]) if j >= 0 else math.nan, float(self.se[k]) if k >= 0 else math.nan)


def observations(con: duckdb.DuckDBPyConnection, leader: str, follower: str) -> dict[str, np.ndarray]:
    """Both legs' log mids at every book of either leg (each leg's latest finite one), from the first
    instant both have one, in (ts_recv, seq) order, and the time since the previous observation."""
    b = con.execute(
        "SELECT ts_recv, symbol = $l AS is_leader, ln((bid_px_0 + ask_px_0) / 2) AS lmid FROM books15 "
        "WHERE symbol IN ($l, $f) AND bid_px_0 > 0 AND ask_px_0 > bid_px_0 AND isfinite(ask_px_0) "
        "ORDER BY ts_recv, seq",
        {"l": leader, "f": follower},
    ).fetchnumpy()
    ts = np.asarray(b["ts_recv"], dtype=np.int64)
    lead_row = np.asarray(b["is_leader"], dtype=bool)
    lmid = np.asarray(b["lmid"], dtype=np.float64)
    idx = np.arange(ts.size)

    def carried(mask: np.ndarray) -> np.ndarray:  # each row's latest value of the rows in mask
        last = np.maximum.accumulate(np.where(mask, idx, -1)) if ts.size else idx
        out = np.full(ts.size, np.nan)
        ok = last >= 0
        out[ok] = lmid[last[ok]]
        return out

    ll, lf = carried(lead_row), carried(~lead_row)
    both = np.isfinite(ll) & np.isfinite(lf)
    ts = ts[both]
    dt = np.diff(ts, prepend=ts[:1]).astype(np.float64)
    return {"ts": ts, "dt": dt, "lead": ll[both], "follow": lf[both]}


def fit(obs: dict[str, np.ndarray], half_life_ns: float, cuts: np.ndarray) -> tuple[np.ndarray, ...]:
    """The hub's estimate after every observation (``pair_series``) and its standard error at each cut
    (the last observation before it): ``(beta, se_ts, se)``."""
    n = obs["ts"].size
    state = pair_state()
    beta, z = np.full(n, np.nan), np.full(n, np.nan)
    bounds = np.unique(np.searchsorted(obs["ts"], np.asarray(cuts, dtype=np.int64), side="left"))
    se_ts, se = [], []
    lo = 0
    for hi in [*bounds.tolist(), n]:
        if hi > lo:
            sl = slice(lo, hi)
            pair_series(
                state, obs["dt"][sl], obs["lead"][sl], obs["follow"][sl], half_life_ns, beta[sl], z[sl]
            )
            se_ts.append(int(obs["ts"][hi - 1]))
            se.append(pair_beta_se(state))
            lo = hi
    return beta, np.asarray(se_ts, dtype=np.int64), np.asarray(se, dtype=np.float64)


def half_life_ns(manifest: dict[str, Any]) -> float:
    return float(manifest.get("config", {}).get("pair_half_life_ms", DEFAULT_HALF_LIFE_MS)) * 1e6


def compute(
    con: duckdb.DuckDBPyConnection,
    pairs: list[Pair],
    regimes: dict[Pair, list[tuple[int, int | None, float]]],
    hedge: dict[Pair, dict[str, np.ndarray]],
    hl_ns: float,
    sample_ns: int,
) -> dict[Pair, PairFit]:
    """Every pair's fit over the run (``con``: :func:`analysis.report.connect`'s views, with the
    portfolio's knobs set): the standard error read every ``sample_ns`` and at each regime's end."""
    out = {}
    for p in pairs:
        obs = observations(con, *p)
        if not obs["ts"].size:
            continue
        t0, t1 = int(obs["ts"][0]), int(obs["ts"][-1])
        ends = [s1 for _, s1, _ in regimes.get(p, []) if s1 is not None]
        cuts = np.union1d(np.arange(t0 + sample_ns, t1 + 1, sample_ns, dtype=np.int64), ends)
        beta, se_ts, se = fit(obs, hl_ns, cuts)
        rolling = {
            k: np.ma.filled(
                np.ma.asarray(v, dtype=np.float64 if k != "t_ns" else np.int64), np.nan if k != "t_ns" else 0
            )
            for k, v in con.execute(
                "SELECT t_ns, beta_returns, beta_returns_se FROM pair_beta "
                "WHERE leader = $l AND follower = $f "
                "ORDER BY t_ns",
                {"l": p[0], "f": p[1]},
            )
            .fetchnumpy()
            .items()
        }
        out[p] = PairFit(p[0], p[1], hl_ns, obs["ts"], beta, se_ts, se, list(regimes.get(p, [])), rolling,
                         hedge.get(p, {}))  # fmt: skip
    return out


def _rel(x: float, truth: float) -> float | None:
    return None if not (math.isfinite(x) and truth) else round((x / truth - 1.0) * 100.0, 2)


def _r(x: Any, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), nd)


def _last_before(ts: np.ndarray, vals: np.ndarray, t_ns: float) -> float:
    j = int(np.searchsorted(ts, t_ns, side="left")) - 1
    return float(vals[j]) if j >= 0 and vals[j] is not None else math.nan


def regime_rows(f: PairFit, start_ns: int) -> list[tuple[Any, ...]]:
    """Per regime seen in the run: its span (s from ``start_ns``), length in half-lives, the true beta,
    the hub's estimate and se at its end (the last observation before the next regime, or the run's
    last) and the error (% of the truth), Kev's last hedge ratio in it and the rolling beta then."""
    rows = []
    ts = f.ts
    for k, (s0, s1, truth) in enumerate(f.regimes):
        start = max(s0, int(ts[0]))
        end = s1 if s1 is not None else int(ts[-1]) + 1
        if end <= ts[0] or start >= end:
            continue
        est, se = f.at(end - 1)
        hl = (end - start) / f.half_life_ns
        kev = math.nan
        c = f.commands
        if len(c.get("ts_recv", [])):
            sel = (c["ts_recv"] >= start) & (c["ts_recv"] < end)
            if sel.any():
                kev = float(c["hedge_ratio"][sel][-1])
        roll = (
            _last_before(f.rolling["t_ns"], f.rolling["beta_returns"].astype(np.float64), end)
            if len(f.rolling.get("t_ns", []))
            else math.nan
        )
        err = _rel(est, truth)
        rows.append((
            f.leader, f.follower, k, _r((start - start_ns) / 1e9, 1),
            _r((min(end, int(ts[-1])) - start_ns) / 1e9, 1),
            _r(hl, 2), _r(truth), _r(est), _r(se), err, hl >= LONG_HALF_LIVES,
            None if err is None else abs(err) <= BOUND * 100, _r(kev), _rel(kev, truth), _r(roll),
            _rel(roll, truth),
        ))  # fmt: skip
    return rows


REGIME_COLUMNS: Final = [
    "leader", "follower", "regime", "start_s", "end_s", "half_lives", "true_beta", "hub_beta", "hub_se",
    "hub_error_pct", "long", "within_5pct", "kev_hedge_last", "kev_error_pct", "rolling_beta",
    "rolling_error_pct",
]  # fmt: skip


def regime_section(fits: dict[Pair, PairFit], start_ns: int) -> Section | None:
    """Estimate vs truth at the end of every regime (simulated sessions), or None without a truth."""
    rows = [r for f in fits.values() if f.regimes for r in regime_rows(f, start_ns)]
    if not rows:
        return None
    title = (
        "Hedge ratio vs the simulator's true beta at the end of each regime (hub: engine/kev/pairs.py's fit, "
        f"error % of the truth; long: >= {LONG_HALF_LIVES:g} half-lives, where it should be within "
        f"{BOUND * 100:g}%; kev: Kev's last commanded hedge ratio; rolling: OLS of 1 s log returns)"
    )
    return Section("hedge_fit_regimes", title, list(REGIME_COLUMNS), rows)


def rolling_rows(f: PairFit, start_ns: int) -> list[tuple[Any, ...]]:
    """The hub's estimate against the rolling beta: at the run's end (both, the band, whether the
    estimate is inside it) and the share of the rolling samples whose band held the estimate."""
    r = f.rolling
    t = np.asarray(r.get("t_ns", []), dtype=np.int64)
    b = np.asarray(r.get("beta_returns", []), dtype=np.float64)
    s = np.asarray(r.get("beta_returns_se", []), dtype=np.float64)
    ok = np.isfinite(b) & np.isfinite(s)
    if not ok.any():
        return []
    t, b, s = t[ok], b[ok], s[ok]
    j = np.searchsorted(f.ts, t, side="right") - 1
    est = np.where(j >= 0, f.beta[np.maximum(j, 0)], np.nan)
    have = np.isfinite(est)
    inside = np.abs(est - b) <= Z95 * s
    end_est, end_se = f.at(t[-1])
    lo, hi = b[-1] - Z95 * s[-1], b[-1] + Z95 * s[-1]
    return [(
        f.leader, f.follower, _r((t[-1] - start_ns) / 1e9, 1), _r(end_est), _r(end_se), _r(b[-1]), _r(lo),
        _r(hi), bool(lo <= end_est <= hi), int(have.sum()),
        _r(float(inside[have].mean()) if have.any() else math.nan, 3),
    )]  # fmt: skip


ROLLING_COLUMNS: Final = [
    "leader", "follower", "at_s", "hub_beta", "hub_se", "rolling_beta", "rolling_ci95_lo", "rolling_ci95_hi",
    "hub_inside", "samples", "share_inside",
]  # fmt: skip


def rolling_section(fits: dict[Pair, PairFit], start_ns: int, window: int, sample_ns: int) -> Section | None:
    """The hub's estimate against the rolling estimate and its 95% band (every pair; the comparison
    recorded data has, with no truth)."""
    rows = [r for f in fits.values() for r in rolling_rows(f, start_ns)]
    if not rows:
        return None
    title = (
        f"Hedge ratio vs a rolling estimate (OLS of {sample_ns / 1e9:g} s log returns over {window} samples, "
        "95% band +-1.96 se) at the run's end, and the share of samples whose band held the hub's estimate"
    )
    return Section("hedge_fit_rolling", title, list(ROLLING_COLUMNS), rows)


def figure(fits: dict[Pair, PairFit], start_ns: int) -> Any:
    """One panel per pair: the hub's estimate with its +-2 se band, the rolling estimate's 95% band,
    Kev's commanded hedge ratios, and the true beta per regime with the +-5% bound (simulated)."""
    import matplotlib.pyplot as plt

    pairs = list(fits)
    fig, axes = plt.subplots(len(pairs), 1, figsize=(10, 3.6 * len(pairs)), squeeze=False,
                             constrained_layout=True)  # fmt: skip
    for ax, p in zip(axes[:, 0], pairs, strict=True):
        f = fits[p]
        t = (f.ts - start_ns) / 1e9
        r = f.rolling
        if len(r.get("t_ns", [])):
            tr = (np.asarray(r["t_ns"], dtype=np.float64) - start_ns) / 1e9
            b = np.asarray(r["beta_returns"], dtype=np.float64)
            s = np.asarray(r["beta_returns_se"], dtype=np.float64)
            ax.fill_between(tr, b - Z95 * s, b + Z95 * s, color="tab:green", alpha=0.15, lw=0,
                            label="rolling estimate, 95% band")  # fmt: skip
            ax.plot(tr, b, color="tab:green", lw=0.6, alpha=0.8)
        st = (f.se_ts - start_ns) / 1e9
        band = np.interp(f.se_ts, f.ts, f.beta) if f.ts.size else f.se
        ax.fill_between(st, band - 2 * f.se, band + 2 * f.se, color="tab:blue", alpha=0.2, lw=0,
                        label="hub estimate +-2 se")  # fmt: skip
        ax.plot(t, f.beta, color="tab:blue", lw=0.9, label="hub estimate (engine/kev/pairs.py)")
        c = f.commands
        if len(c.get("ts_recv", [])):
            ax.scatter((c["ts_recv"] - start_ns) / 1e9, c["hedge_ratio"], s=6, color="tab:red", zorder=3,
                       label="Kev's commanded hedge ratio")  # fmt: skip
        finite = f.beta[np.isfinite(f.beta)]
        lo_hi = (
            [float(np.quantile(finite, 0.02)), float(np.quantile(finite, 0.98))] if finite.size else [0, 2]
        )
        for k, (s0, s1, truth) in enumerate(f.regimes):
            x0 = max((s0 - start_ns) / 1e9, t[0])
            x1 = t[-1] if s1 is None else (s1 - start_ns) / 1e9
            if x1 > x0:
                ax.hlines(truth, x0, x1, colors="black", lw=1.5, label="true beta" if k == 0 else None)
                ax.hlines([truth * (1 - BOUND), truth * (1 + BOUND)], x0, x1, colors="0.5", lw=0.6, ls=":",
                          label=f"+-{BOUND * 100:g}%" if k == 0 else None)  # fmt: skip
                lo_hi += [truth * 0.9, truth * 1.1]
        ax.set_ylim(min(lo_hi) - 0.05, max(lo_hi) + 0.05)
        ax.set_ylabel("beta")
        ax.set_title(f"{p[1]} on {p[0]}: the hub's hedge ratio against "
                     + ("the true beta" if f.regimes else "a rolling estimate"))  # fmt: skip
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    axes[-1, 0].set_xlabel("seconds from the first book")
    return fig
