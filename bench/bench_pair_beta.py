"""The pairs hub's hedge ratio against the simulator's true beta, per regime and per seed.

Simulates BTCUSDT/ETHUSDT sessions (``dualhub simulate --symbols``), feeds the fit
(``engine.kev.pairs.pair_update``) both legs' mids at every book of either leg, as the portfolio
hub does (``engine/kernel/`` ``pf_observe``), and prints, per regime of each session, the true beta,
the estimate and its standard error at the regime's end, and the relative error; a regime that lasted
at least 3 half-lives is marked ``long`` (the bound of issue 55: within 5%). Saves a PNG of the
estimate (with a 2-standard-error band) against the truth over time, one panel per seed.

    .venv/bin/python bench/bench_pair_beta.py --seeds 1-5 --minutes 10 --png pair_beta.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kev.pairs import P_BETA, pair_beta_se, pair_state, pair_update  # noqa: E402

MS = 1_000_000
BOUND = 0.05
LONG_HALF_LIVES = 3.0


def simulate(out: Path, seed: int, minutes: float, leader: str, follower: str) -> Path:
    from venue.simulator import simulate_session

    return simulate_session(out, symbols=(leader, follower), minutes=minutes, seed=seed)


def observations(session: Path, leader: str, follower: str) -> dict:
    """Both legs' log mids at every book of either leg (each the latest of its leg), from the first
    time both have one, the time between observations, and the session's true regimes."""
    manifest = json.loads((session / "manifest.json").read_text())
    t = ds.dataset(session / "books15").to_table(columns=["ts_recv", "seq", "symbol", "bid_px_0", "ask_px_0"])
    t = t.sort_by([("ts_recv", "ascending"), ("seq", "ascending")])
    ts = t["ts_recv"].to_numpy()
    sym = t["symbol"].to_numpy(zero_copy_only=False)
    mid = (t["bid_px_0"].to_numpy() + t["ask_px_0"].to_numpy()) / 2
    lead = np.full(len(ts), np.nan)
    follow = np.full(len(ts), np.nan)
    last = {leader: math.nan, follower: math.nan}
    for i in range(len(ts)):
        last[sym[i]] = math.log(mid[i])
        lead[i], follow[i] = last[leader], last[follower]
    both = np.isfinite(lead) & np.isfinite(follow)
    ts = ts[both]
    (pair,) = [p for p in manifest["simulator"]["pairs"] if p["follower"] == follower]
    return {
        "ts": ts,
        "dt": np.diff(ts, prepend=ts[0]).astype(np.float64),
        "lead": lead[both],
        "follow": follow[both],
        "regimes": pair["regimes"],
    }


def fit(obs: dict, half_life_ns: float) -> tuple[np.ndarray, np.ndarray]:
    """The hedge ratio and its standard error after every observation."""
    st = pair_state()
    n = len(obs["ts"])
    beta, se = np.empty(n), np.empty(n)
    for i in range(n):
        pair_update(st, obs["lead"][i], obs["follow"][i], obs["dt"][i], half_life_ns)
        beta[i], se[i] = st[P_BETA], pair_beta_se(st)
    return beta, se


def regime_ends(obs: dict, beta: np.ndarray, se: np.ndarray, half_life_ns: float) -> list[dict]:
    """Per regime seen in the session: its true beta and the estimate at its end (the last
    observation before the next regime, or the session's last). A regime's duration counts from the
    later of its start and the first observation."""
    ts, regimes = obs["ts"], obs["regimes"]
    rows = []
    for k, r in enumerate(regimes):
        start = max(r["start_ms"] * MS, int(ts[0]))
        end = regimes[k + 1]["start_ms"] * MS if k + 1 < len(regimes) else int(ts[-1]) + 1
        if end <= ts[0]:
            continue
        j = int(np.searchsorted(ts, end)) - 1
        dur = (end - start) / half_life_ns
        rows.append(
            {
                "regime": k,
                "start_s": (start - ts[0]) / 1e9,
                "half_lives": dur,
                "true": r["beta"],
                "estimate": float(beta[j]),
                "se": float(se[j]),
                "error": float(beta[j] / r["beta"] - 1.0),
                "long": dur >= LONG_HALF_LIVES,
            }
        )
    return rows


def seeds_arg(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 1,3,7")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--half-life-s", type=float, default=60.0, help="the fit's half-life (pair_half_life_ms)")
    ap.add_argument("--symbols", default="BTCUSDT,ETHUSDT", help="leader,follower")
    ap.add_argument(
        "--sessions", type=Path, help="keep the simulated sessions here (default: a temporary folder)"
    )
    ap.add_argument("--png", type=Path, default=Path("pair_beta.png"), help="the plot ('' for none)")
    args = ap.parse_args(argv)
    leader, follower = args.symbols.split(",")
    hl = args.half_life_s * 1e9
    seeds = seeds_arg(args.seeds)
    tmp = None
    root = args.sessions
    if root is None:
        tmp = tempfile.TemporaryDirectory()
        root = Path(tmp.name)
    runs = []
    print(
        f"{'seed':>4} {'regime':>6} {'start s':>8} {'half-lives':>10} {'true':>7} {'estimate':>8} {'se':>6} "
        f"{'error':>7}  long"
    )
    worst = 0.0
    for seed in seeds:
        session = root / f"{leader}-{follower}-seed{seed}-{args.minutes:g}m"
        if not (session / "manifest.json").exists():
            simulate(session, seed, args.minutes, leader, follower)
        obs = observations(session, leader, follower)
        beta, se = fit(obs, hl)
        rows = regime_ends(obs, beta, se, hl)
        for r in rows:
            mark = "long" + (" OUT" if abs(r["error"]) > BOUND else "") if r["long"] else ""
            if r["long"]:
                worst = max(worst, abs(r["error"]))
            print(
                f"{seed:>4} {r['regime']:>6} {r['start_s']:>8.0f} {r['half_lives']:>10.2f} {r['true']:>7.3f} "
                f"{r['estimate']:>8.3f} {r['se']:>6.3f} {r['error'] * 100:>+6.1f}%  {mark}"
            )
        runs.append((seed, obs, beta, se))
    print(
        f"worst error at the end of a regime of >= {LONG_HALF_LIVES:g} half-lives: {worst * 100:.2f}% "
        f"(bound {BOUND * 100:g}%)"
    )
    if str(args.png):
        plot(runs, args.png, leader, follower)
        print(f"plot: {args.png}")
    if tmp is not None:
        tmp.cleanup()
    return 0


def plot(runs: list, png: Path, leader: str, follower: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.4 * len(runs)), sharex=True, squeeze=False)
    for ax, (seed, obs, beta, se) in zip(axes[:, 0], runs, strict=True):
        t = (obs["ts"] - obs["ts"][0]) / 1e9
        starts = np.array([r["start_ms"] * MS for r in obs["regimes"]])
        true = np.array([r["beta"] for r in obs["regimes"]])[np.searchsorted(starts, obs["ts"], "right") - 1]
        ax.fill_between(t, beta - 2 * se, beta + 2 * se, color="tab:blue", alpha=0.2, lw=0, label="±2 se")
        ax.plot(t, beta, color="tab:blue", lw=0.8, label="estimate")
        ax.plot(t, true, color="black", lw=1.2, drawstyle="steps-post", label="true beta")
        ax.plot(t, true * (1 + BOUND), color="grey", lw=0.5, ls=":", drawstyle="steps-post")
        ax.plot(t, true * (1 - BOUND), color="grey", lw=0.5, ls=":", drawstyle="steps-post")
        lo, hi = np.nanmin(true) * 0.7, np.nanmax(true) * 1.3
        ax.set_ylim(lo, hi)
        ax.set_ylabel(f"seed {seed}")
    axes[0, 0].set_title(f"{follower}/{leader} hedge ratio: estimate vs the simulator's true beta")
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
