"""The Portfolio section of a run's report, for a run trading more than one instrument.

One implementation for ``dualhub report RUN`` (console), ``--html`` and ``notebooks/12_portfolio``:
:func:`compute` reads the run through the portfolio views of ``views.sql`` (``run_symbols``,
``symbol_equity``, ``portfolio_equity``, ``portfolio_pnl``, ``pair_beta``, ``hedge_ratio``,
``pair_regimes``, ``risk_refusals_bucketed``) and runs the tables of ``portfolio.sql``;
:func:`header_lines`, :func:`sections` and :func:`figures` give its header, tables and plots. It leads
with the portfolio, then each leg, and the loss stops (analysis/portfolio_lead.py), and shows the
pairs hub's hedge ratio against the truth or a rolling estimate (analysis/hedge_fit.py).
docs/ANALYSIS.md ("Portfolio") defines every number. A run with one symbol has no Portfolio section:
:func:`compute` returns None for it, and its report is the single-instrument report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import duckdb
import numpy as np

from analysis import hedge_fit, portfolio_lead
from analysis.report import Section, connect, load_queries

BETA_SAMPLE_NS: Final = 1_000_000_000  # the pairs' mids sampled every second for the realised beta
BETA_WINDOW: Final = 300  # samples in the rolling beta's window
SAMPLE_NS: Final = 1_000_000_000  # the portfolio's and each leg's PnL sampled every second for Sharpe
MAX_BUCKETS: Final = 60  # risk refusals: the bucket is the shortest nice step giving at most this many
NICE_BUCKETS_S: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)

Pair = tuple[str, str]  # (leader, follower)


def bucket_ns_for(span_ns: int) -> int:
    """The shortest step of :data:`NICE_BUCKETS_S` that cuts ``span_ns`` into at most
    :data:`MAX_BUCKETS` buckets (the longest step for longer runs)."""
    for s in NICE_BUCKETS_S:
        if span_ns / (s * 1_000_000_000) <= MAX_BUCKETS:
            return s * 1_000_000_000
    return NICE_BUCKETS_S[-1] * 1_000_000_000


def run_symbols(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The run's instruments (views.sql ``run_symbols``), sorted."""
    return sorted(str(r[0]) for r in con.sql("SELECT symbol FROM run_symbols").fetchall())


def _columns(con: duckdb.DuckDBPyConnection, sql: str, **params: Any) -> dict[str, np.ndarray]:
    rel = con.execute(sql, params) if params else con.execute(sql)
    return {k: np.asarray(v) for k, v in rel.fetchnumpy().items()}


@dataclass
class PortfolioReport:
    run: Path
    symbols: list[str]
    start_ns: int  # the portfolio's first book: time 0 of every plot and table
    bucket_ns: int
    beta_sample_ns: int
    beta_window: int
    tables: list[Section]  # portfolio.sql, in file order
    equity: dict[str, np.ndarray]  # ts_recv, pnl, net_delta_usd, gross_usd (portfolio_equity)
    symbol_equity: dict[str, dict[str, np.ndarray]]  # symbol -> ts_recv, pnl, position, delta_usd
    beta: dict[Pair, dict[str, np.ndarray]] = field(default_factory=dict)  # t_ns, beta_returns, beta_levels
    hedge: dict[Pair, dict[str, np.ndarray]] = field(default_factory=dict)  # ts_recv, hedge_ratio
    regimes: dict[Pair, list[tuple[int, int | None, float]]] = field(default_factory=dict)  # start, end, beta
    refusals: dict[str, np.ndarray] = field(default_factory=dict)  # bucket_s, reason, symbol, level, n
    lead: portfolio_lead.Lead | None = None  # the portfolio and each leg, limits and loss stops
    fits: dict[Pair, hedge_fit.PairFit] = field(default_factory=dict)  # the hub's hedge ratio over time
    legging: dict[str, Any] | None = None  # a hub run's legging episodes (:func:`legging`)


def compute(
    run_dir: Path | str,
    *,
    bucket_ns: int | None = None,
    beta_sample_ns: int = BETA_SAMPLE_NS,
    beta_window: int = BETA_WINDOW,
    sample_ns: int = SAMPLE_NS,
) -> PortfolioReport | None:
    """The Portfolio section of a run (checked against its manifest first), or None when the run has
    one symbol. ``bucket_ns`` (risk refusals per bucket) defaults to :func:`bucket_ns_for` the run's
    span; ``sample_ns``: the PnL's sampling for Sharpe."""
    if beta_sample_ns <= 0 or beta_window < 2 or (bucket_ns is not None and bucket_ns <= 0) or sample_ns <= 0:
        raise ValueError("beta_sample_ns, bucket_ns and sample_ns must be > 0 and beta_window >= 2")
    run = Path(run_dir)
    con = connect(run)
    try:
        symbols = run_symbols(con)
        if len(symbols) < 2:
            return None
        start_ns, span_ns = con.sql("SELECT start_ns, span_ns FROM portfolio_span").fetchall()[0]
        bucket = int(bucket_ns or bucket_ns_for(int(span_ns or 0)))
        con.execute(f"SET VARIABLE bucket_ns = {bucket}")
        con.execute(f"SET VARIABLE beta_sample_ns = {int(beta_sample_ns)}")
        con.execute(f"SET VARIABLE beta_window = {int(beta_window)}")
        tables = []
        for name, title, sql in load_queries("portfolio.sql"):
            rel = con.sql(sql)
            tables.append(Section(name, title, list(rel.columns), rel.fetchall()))
        equity = _columns(
            con, "SELECT ts_recv, pnl, net_delta_usd, gross_usd FROM portfolio_equity ORDER BY ts_recv"
        )
        per = {
            s: _columns(
                con,
                "SELECT ts_recv, pnl, CAST(position AS DOUBLE) AS position, delta_usd FROM symbol_equity "
                "WHERE symbol = $s ORDER BY ts_recv, seq",
                s=s,
            )
            for s in symbols
        }
        pairs = [(str(a), str(b)) for a, b in con.sql("SELECT leader, follower FROM pairs").fetchall()]
        beta = {
            p: _columns(
                con,
                "SELECT t_ns, beta_returns, beta_levels FROM pair_beta WHERE leader = $l AND follower = $f "
                "ORDER BY t_ns",
                l=p[0],
                f=p[1],
            )
            for p in pairs
        }
        hedge = {
            p: _columns(
                con,
                "SELECT ts_recv, hedge_ratio FROM hedge_ratio WHERE leader = $l AND follower = $f "
                "ORDER BY ts_recv, seq",
                l=p[0],
                f=p[1],
            )
            for p in pairs
        }
        regimes: dict[Pair, list[tuple[int, int | None, float]]] = {p: [] for p in pairs}
        for a, b, s0, s1, beta_true in con.sql(
            "SELECT leader, follower, start_ns, end_ns, true_beta FROM pair_regimes ORDER BY start_ns"
        ).fetchall():
            if (a, b) in regimes:
                regimes[(a, b)].append((int(s0), None if s1 is None else int(s1), float(beta_true)))
        refusals = _columns(
            con, "SELECT bucket_s, reason, symbol, level, n FROM risk_refusals_bucketed ORDER BY ALL"
        )
        import orjson

        manifest = orjson.loads((run / "manifest.json").read_bytes())
        lead = portfolio_lead.compute(con, manifest, sample_ns)
        fits = hedge_fit.compute(
            con, pairs, regimes, hedge, hedge_fit.half_life_ns(manifest), int(beta_sample_ns)
        )
    finally:
        con.close()
    return PortfolioReport(
        run=run,
        symbols=symbols,
        start_ns=int(start_ns or 0),
        bucket_ns=bucket,
        beta_sample_ns=int(beta_sample_ns),
        beta_window=int(beta_window),
        tables=tables,
        equity=equity,
        symbol_equity=per,
        beta=beta,
        hedge=hedge,
        regimes=regimes,
        refusals=refusals,
        lead=lead,
        fits=fits,
        legging=legging(run),
    )


def _seconds(ns: float) -> str:
    s = ns / 1e9
    return f"{s / 60:g} min" if s >= 60 and s % 60 == 0 else f"{s:g} s"


def header_lines(pf: PortfolioReport, run_symbol: str | None) -> list[str]:
    """What the Portfolio section covers, and what the single-instrument parts above it do not."""
    lines = [
        f"portfolio: {len(pf.symbols)} instruments ({', '.join(pf.symbols)}); the Portfolio section "
        "covers all of them"
        + (
            f"; the tear sheet after it is {run_symbol}'s alone (config.symbol, its tables titled so) and "
            "the report's tables name each row's symbol"
            if run_symbol
            else ""
        )
    ]
    if pf.lead is not None:
        lines.extend(portfolio_lead.header_lines(pf.lead))
    lines.append(
        f"portfolio: realised beta = rolling OLS over {pf.beta_window} samples of "
        f"{_seconds(pf.beta_sample_ns)}; risk refusals counted per {_seconds(pf.bucket_ns)}"
    )
    if pf.fits:
        hl = next(iter(pf.fits.values())).half_life_ns
        lines.append(
            "portfolio: the hub's hedge ratio = engine/kev/pairs.py's fit (lead-lag corrected regression of "
            f"log returns, half-life {_seconds(hl)}) re-run over the run's books"
        )
    return lines


def sections(pf: PortfolioReport) -> list[Section]:
    """The Portfolio section's tables (console and HTML print them as they are): the portfolio and
    each leg, the loss stops, the tables of portfolio.sql, then the hedge ratio against the truth
    (simulated sessions) and against a rolling estimate."""
    out = portfolio_lead.sections(pf.lead) if pf.lead is not None else []
    if pf.legging is not None:
        out.append(legging_section(pf.legging))
    out.extend(pf.tables)
    if pf.fits:
        for s in (
            hedge_fit.regime_section(pf.fits, pf.start_ns),
            hedge_fit.rolling_section(pf.fits, pf.start_ns, pf.beta_window, pf.beta_sample_ns),
        ):
            if s is not None:
                out.append(s)
    return out


# -- plots ------------------------------------------------------------------------------------------


def _t(ts: np.ndarray, t0: int) -> np.ndarray:
    return (np.asarray(ts, dtype=np.float64) - t0) / 1e9


def figures(pf: PortfolioReport) -> dict[str, Any]:
    """The Portfolio section's plots as matplotlib figures, by name: PnL per instrument and in total,
    net delta and gross exposure, Kev's hedge ratio against the realised and true beta per pair, and
    the risk refusals per bucket by rule and instrument."""
    import matplotlib.pyplot as plt  # the caller's backend: inline in a notebook, Agg for --html

    figs: dict[str, Any] = {}
    t0 = pf.start_ns
    fig, ax = plt.subplots(figsize=(10, 3.6), constrained_layout=True)
    for s in pf.symbols:
        e = pf.symbol_equity[s]
        ax.step(_t(e["ts_recv"], t0), e["pnl"], where="post", lw=0.9, label=s)
    ax.step(
        _t(pf.equity["ts_recv"], t0), pf.equity["pnl"], where="post", lw=1.6, color="black", label="portfolio"
    )
    ax.axhline(0, color="0.6", lw=0.6)
    ax.set_ylabel("USDT")
    ax.set_xlabel("seconds from the first book")
    ax.set_title("PnL per instrument and for the portfolio (mark to mid, after fees)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    figs["portfolio_pnl"] = fig

    fig, ax = plt.subplots(figsize=(10, 3.6), constrained_layout=True)
    t = _t(pf.equity["ts_recv"], t0)
    ax.fill_between(t, 0, pf.equity["gross_usd"], step="post", color="tab:orange", alpha=0.25, lw=0,
                    label="gross exposure")  # fmt: skip
    ax.step(t, pf.equity["net_delta_usd"], where="post", color="tab:blue", lw=1.1, label="net delta")
    for s in pf.symbols:
        e = pf.symbol_equity[s]
        ax.step(
            _t(e["ts_recv"], t0), e["delta_usd"], where="post", lw=0.6, alpha=0.7, ls="--", label=f"{s} delta"
        )
    ax.axhline(0, color="0.6", lw=0.6)
    ax.set_ylabel("USDT")
    ax.set_xlabel("seconds from the first book")
    ax.set_title("net delta (sum of position x mid) and gross exposure (sum of |position x mid|)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    figs["portfolio_exposure"] = fig

    if pf.beta:
        pairs = list(pf.beta)
        fig, axes = plt.subplots(len(pairs), 1, figsize=(10, 3.4 * len(pairs)), squeeze=False,
                                 constrained_layout=True)  # fmt: skip
        for ax, p in zip(axes[:, 0], pairs, strict=True):
            b = pf.beta[p]
            tb = _t(b["t_ns"], t0)
            ax.plot(tb, b["beta_returns"], lw=0.9, color="tab:blue", label="realised beta (log returns)")
            ax.plot(
                tb, b["beta_levels"], lw=0.7, color="tab:cyan", alpha=0.6, label="realised beta (log mids)"
            )
            h = pf.hedge.get(p)
            if h is not None and len(h["ts_recv"]):
                th = _t(h["ts_recv"], t0)
                ax.step(
                    th, h["hedge_ratio"], where="post", color="tab:red", lw=1.2, label="Kev's hedge ratio"
                )
                ax.scatter(th, h["hedge_ratio"], s=10, color="tab:red", zorder=3)
            end = tb[-1] if len(tb) else 0.0
            for k, (s0, s1, beta) in enumerate(pf.regimes.get(p, [])):
                x0 = max((s0 - t0) / 1e9, tb[0] if len(tb) else 0.0)
                x1 = end if s1 is None else (s1 - t0) / 1e9
                if x1 > x0:
                    ax.hlines(
                        beta, x0, x1, colors="black", lw=1.4, ls="--", label="true beta" if k == 0 else None
                    )
            ax.set_ylabel("beta")
            ax.set_title(f"{p[1]} on {p[0]}: Kev's hedge ratio against the realised beta "
                         f"({pf.beta_window} x {_seconds(pf.beta_sample_ns)} window)")  # fmt: skip
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        axes[-1, 0].set_xlabel("seconds from the first book")
        figs["hedge_ratio"] = fig

    fig, ax = plt.subplots(figsize=(10, 3.4), constrained_layout=True)
    r = pf.refusals
    if len(r.get("n", [])):
        keys = sorted({(str(a), str(b)) for a, b in zip(r["reason"], r["symbol"], strict=True)})
        buckets = np.unique(r["bucket_s"].astype(np.float64))
        bottom = np.zeros(buckets.size)
        w = pf.bucket_ns / 1e9
        for reason, sym in keys:
            sel = (r["reason"] == reason) & (r["symbol"] == sym)
            counts = np.zeros(buckets.size)
            counts[np.searchsorted(buckets, r["bucket_s"][sel].astype(np.float64))] = r["n"][sel]
            hatch = "//" if reason.startswith("portfolio_") else None
            ax.bar(buckets, counts, width=w, bottom=bottom, align="edge", label=f"{reason} / {sym}",
                   hatch=hatch, edgecolor="white", lw=0.3)  # fmt: skip
            bottom += counts
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    else:
        ax.text(0.5, 0.5, "no risk refusals", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("seconds from the first book")
    ax.set_ylabel(f"refusals per {_seconds(pf.bucket_ns)}")
    ax.set_title("which risk rule bound when (hatched: portfolio-wide rules)")
    figs["risk_rules"] = fig
    if pf.fits:
        figs["hedge_fit"] = hedge_fit.figure(pf.fits, t0)
    return figs


def legging(run: Path, span_ns: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """A hub run's legging (engine/legs.py, ``events/legging.parquet``): how many episodes, how each
    closed, the residual's time-weighted notional (the sum of each episode's notional x its duration,
    over the run's span: USD held unhedged on average) and the longest episode (seconds, its symbol).
    ``span_ns``: the run's (first, last) time; by default its labels' first and last receive time. None
    for a run without the file (one instrument, or written before it existed)."""
    ev = Path(run) / "events"
    path = ev / "legging.parquet"
    if not path.exists():
        return None
    con = duckdb.connect()
    rows = con.execute(
        "SELECT symbol, residual_notional_usd, start_ns, end_ns, closed FROM read_parquet($p) ORDER BY seq",
        {"p": str(path)},
    ).fetchall()
    if span_ns is None:
        lo, hi = con.execute(
            "SELECT min(ts_recv), max(ts_recv) FROM read_parquet($p)", {"p": str(ev / "label.parquet")}
        ).fetchone() or (None, None)
        span_ns = (int(lo or 0), int(hi or 0))
    span = max(1, span_ns[1] - span_ns[0])
    longest = max(rows, key=lambda r: r[3] - r[2], default=None)
    closed: dict[str, int] = {}
    for r in rows:
        closed[r[4]] = closed.get(r[4], 0) + 1
    return {
        "episodes": len(rows),
        "closed": closed,
        "time_weighted_notional_usd": sum(r[1] * (r[3] - r[2]) for r in rows) / span,
        "longest_s": (longest[3] - longest[2]) / 1e9 if longest else 0.0,
        "longest_symbol": longest[0] if longest else "",
    }


def legging_section(summary: dict[str, Any]) -> Section:
    """:func:`legging` as the report's table: one row, after the loss stops."""
    how = ", ".join(f"{k} {v}" for k, v in sorted(summary["closed"].items())) or "-"
    return Section(
        "legging",
        "Legging: a hub command's leg left unfilled past leg_timeout_ms, hedged as leg_hedge says "
        "(residual_twa_usd: the unhedged notional averaged over the run; longest: the longest episode)",
        ["episodes", "closed", "residual_twa_usd", "longest_s", "longest_symbol"],
        [
            (
                summary["episodes"],
                how,
                round(summary["time_weighted_notional_usd"], 2),
                round(summary["longest_s"], 3),
                summary["longest_symbol"] or "-",
            )
        ],
    )


def legging_lines(summary: dict[str, Any] | None) -> list[str]:
    """:func:`legging` as the report's lines (none without legging data)."""
    if summary is None:
        return []
    if not summary["episodes"]:
        return ["legging: none (every hub command's legs filled within leg_timeout_ms)"]
    how = ", ".join(f"{k} {v}" for k, v in sorted(summary["closed"].items()))
    return [
        f"legging: {summary['episodes']} episodes ({how}); residual time-weighted "
        f"{summary['time_weighted_notional_usd']:,.2f} USD; longest {summary['longest_s']:.3f} s "
        f"({summary['longest_symbol']})"
    ]
