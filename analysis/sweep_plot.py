"""A sweep's results plotted: each metric against a swept parameter, seeds as error bars.

``dualhub sweep GRID.toml ... --plot out.png`` calls :func:`plot_sweep` on the results table it wrote
(or kept, with ``--resume``). One panel per metric; x is the first swept parameter (``--plot-x`` another),
one line per combination of the other swept parameters; each point is the mean over the runs that
share its parameters (the seeds, and the sessions when there are several) with its standard error
as the error bar; single runs are the faint dots, and runs where the loss stop hit in their first
half are red crosses (a comparison they dominate compares where the stop hit).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from engine.errors import DualhubError

METRICS: Final = ("pnl_usdt", "sharpe", "max_drawdown_usdt", "fills", "loss_stop_at_frac")
SEED_COLUMN: Final = "p_seed"
INTEGER_METRICS: Final = (
    "fills",
    "orders",
    "books",
    "trades",
    "kev_requests",
    "kev_drops",
    "risk_rejections",
)


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def swept(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The parameter columns (``p_...``) that take more than one value, the seed left out."""
    cols = sorted({k for r in rows for k in r if k.startswith("p_") and k != SEED_COLUMN})
    return [c for c in cols if len({repr(r.get(c)) for r in rows}) > 1]


def plot_sweep(
    rows: Sequence[Mapping[str, Any]],
    out: Path | str,
    *,
    metrics: Sequence[str] | None = None,
    x: str | None = None,
) -> Path:
    """Write the plot of ``rows`` (a sweep's results, :func:`replay.sweep.read_results`) to ``out`` (PNG).
    ``metrics``: the panels (default :data:`METRICS`, those the results have: an older table has no
    ``sharpe``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    from analysis.report import check_output_file
    from engine.store import atomic_write_bytes

    ok = [r for r in rows if not r.get("error")]
    if not ok:
        raise DualhubError("no finished run in the sweep's results to plot")
    axes_ = swept(ok)
    if x is None:
        x = axes_[0] if axes_ else SEED_COLUMN
    col = x if x.startswith("p_") else "p_" + x.replace(".", "_")
    if not any(col in r for r in ok):
        raise DualhubError(f"no parameter {x!r} in the results; swept: {', '.join(axes_) or 'none'}")
    if metrics is None:
        metrics = [m for m in METRICS if m in ok[0]]
    unknown = [m for m in metrics if m not in ok[0]]
    if unknown:
        raise DualhubError(f"no results column {unknown}; e.g. {', '.join(METRICS)}")
    others = [c for c in axes_ if c != col]
    xs = sorted({r.get(col) for r in ok}, key=lambda v: (isinstance(v, str), v))
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in xs)
    pos = {v: (float(v) if numeric else i) for i, v in enumerate(xs)}
    series: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in ok:
        series.setdefault(tuple(r.get(c) for c in others), []).append(r)
    seeds = {r.get(SEED_COLUMN) for r in ok}
    sessions = {r.get("session") for r in ok}
    stopped = [r for r in ok if r.get("loss_stop_at_frac") is not None and r["loss_stop_at_frac"] > 0.5]
    stopped_ids = {id(r) for r in stopped}

    fig, axs = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics) + 1.5, 3.8), constrained_layout=True)
    axs = np.atleast_1d(axs)
    for ax, m in zip(axs, metrics, strict=True):
        for k, (key, rs) in enumerate(sorted(series.items(), key=lambda kv: repr(kv[0]))):
            mean, sem, px = [], [], []
            for v in xs:
                vals = np.array([_num(r.get(m)) for r in rs if r.get(col) == v], dtype=float)
                vals = vals[np.isfinite(vals)]
                if not vals.size:
                    continue
                px.append(pos[v])
                mean.append(vals.mean())
                sem.append(vals.std(ddof=1) / math.sqrt(vals.size) if vals.size > 1 else 0.0)
            label = ", ".join(f"{c[2:]}={v}" for c, v in zip(others, key, strict=True)) or "mean ± s.e."
            ax.errorbar(px, mean, yerr=sem, marker="o", capsize=4, label=label, color=f"C{k}")
            for r in rs:
                y = _num(r.get(m))
                if math.isfinite(y) and id(r) not in stopped_ids:
                    ax.scatter(pos[r.get(col)], y, s=10, color=f"C{k}", alpha=0.3, lw=0)
        for r in stopped:
            y = _num(r.get(m))
            if math.isfinite(y):
                ax.scatter(pos[r.get(col)], y, s=30, marker="x", color="tab:red", lw=1)
        if numeric and all(v > 0 for v in xs) and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks([pos[v] for v in xs], [f"{v:g}" if numeric else str(v) for v in xs])
        if m in INTEGER_METRICS:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(col[2:])
        ax.set_title(m, fontsize=10)
    if stopped:
        axs[0].scatter([], [], s=30, marker="x", color="tab:red", label="loss stop in the first half")
    axs[0].legend(fontsize=7, framealpha=0.8, loc="best")
    fig.suptitle(
        f"{len(ok)} runs: {len(seeds)} seed(s) x {len(sessions)} session(s) per point "
        "(error bars: standard error)",
        fontsize=10,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    out = Path(out)
    check_output_file(out)  # again: a caller from Python skips the command's early check
    atomic_write_bytes(out, buf.getvalue())
    return out
