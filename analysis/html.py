"""``dualhub report RUN --html OUT.html``: the key plots of a run in one self-contained HTML file.

Everything is read through the run's DuckDB views (:func:`analysis.report.connect`): mid and
fills, inventory, mark-to-market PnL, the per-decision latency breakdown and Laya's label counts,
plus the report's tables. Plots are matplotlib figures embedded as base64 PNG, so the file has no
external references. The series functions here are the ones the notebooks in ``notebooks/`` use.

PnL here is float, for plotting (cash from fills minus fees plus position at the mid); the exact
decimal PnL is the report's ``pnl`` section.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Final

import duckdb
import numpy as np
import orjson

from analysis.report import Section, _q, check_output_file, connect, leg_titled, run_report

NS_PER_S: Final = 1e9
STAGES: Final = ("feed", "laya", "kev_queue", "kev", "decide", "order_entry", "fill")

# One row per new order (views.sql's ``decisions``): its driver and each stage's duration in ns (NULL
# where the stage is not on its path, and the fill stage of an order never filled).
DECISION_LATENCY_SQL: Final = """
SELECT client_oid, order_type, side, new_ns, driver, feed_ns, laya_ns, kev_queue_ns, kev_ns, decide_ns,
       order_entry_ns, fill_ns
FROM decisions ORDER BY new_ns, client_oid
"""


def run_manifest(run_dir: Path | str) -> dict[str, Any]:
    return orjson.loads((Path(run_dir) / "manifest.json").read_bytes())


def run_symbol(run_dir: Path | str) -> str:
    return str(run_manifest(run_dir).get("config", {}).get("symbol", "BTCUSDT"))


def connect_session(session_dir: Path | str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one view per stream of a session (books15, trade, gap, ...)."""
    from engine.store import open_session

    session = open_session(session_dir)
    con = duckdb.connect()
    for stream in session.streams:
        files = session.files(stream)
        if files:
            con.execute(
                f'CREATE VIEW "{stream}" AS SELECT * FROM read_parquet([{", ".join(_q(f) for f in files)}])'
            )
    return con


def fetch(con: duckdb.DuckDBPyConnection, sql: str, **params: Any) -> dict[str, np.ndarray]:
    """Run ``sql`` and return its columns as numpy arrays."""
    rel = con.execute(sql, params) if params else con.execute(sql)
    cols = [d[0] for d in rel.description]
    rows = rel.fetchall()
    out: dict[str, np.ndarray] = {}
    for i, c in enumerate(cols):
        vals = [r[i] for r in rows]
        if all(v is None or isinstance(v, (int, float)) for v in vals):
            out[c] = np.array([np.nan if v is None else v for v in vals], dtype=np.float64)
        else:
            out[c] = np.array(vals, dtype=object)
    return out


def pnl_series(con: duckdb.DuckDBPyConnection, symbol: str | None = None) -> dict[str, np.ndarray]:
    """``ts_recv, mid, position, cash, pnl`` at every book of the run's symbol (views.sql ``equity``);
    ``symbol``, if given, must be the run's."""
    sql = (
        "SELECT ts_recv, mid, position, cash, pnl FROM equity "
        "WHERE $s IS NULL OR $s = getvariable('run_symbol')"
    )
    return fetch(con, sql + " ORDER BY ts_recv, seq", s=symbol)


def fills(con: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    return fetch(
        con,
        "SELECT ts_recv, side, px, qty, liquidity, position_after FROM fill ORDER BY ts_recv, seq",
    )


def decision_latency(con: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    """One row per new order: driver (label / kev / requote) and ``<stage>_ns`` per stage."""
    return fetch(con, DECISION_LATENCY_SQL)


def label_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    rows = con.execute("SELECT label, count(*) FROM label GROUP BY label ORDER BY label").fetchall()
    return {str(k): int(v) for k, v in rows}


def _t_s(ts: np.ndarray, t0: float) -> np.ndarray:
    return (np.asarray(ts, dtype=np.float64) - t0) / NS_PER_S


# -- plots ------------------------------------------------------------------------------------------


def plot_mid_fills(ax: Any, pnl: dict[str, np.ndarray], fl: dict[str, np.ndarray], t0: float) -> None:
    ax.plot(_t_s(pnl["ts_recv"], t0), pnl["mid"], lw=0.8, color="0.35", label="mid")
    # sells first, buys on top, both small and translucent: neither side hides the other
    for side, color, marker in (("sell", "tab:red", "v"), ("buy", "tab:green", "^")):
        sel = fl["side"] == side
        if sel.any():
            ax.scatter(
                _t_s(fl["ts_recv"][sel], t0),
                fl["px"][sel],
                s=9,
                c=color,
                marker=marker,
                alpha=0.6,
                lw=0,
                label=side,
            )
    ax.set_ylabel("price")
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")  # prices, not "+6.5e4" offsets
    ax.set_title("mid and fills")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)


def plot_inventory(ax: Any, pnl: dict[str, np.ndarray], t0: float) -> None:
    ax.step(_t_s(pnl["ts_recv"], t0), pnl["position"], where="post", lw=0.9, color="tab:blue")
    ax.axhline(0.0, color="0.6", lw=0.6)
    ax.set_ylabel("position")
    ax.set_title("inventory")


def plot_pnl(ax: Any, pnl: dict[str, np.ndarray], t0: float, loss_stop: dict[str, Any] | None = None) -> None:
    """PnL at every book; ``loss_stop`` (views.sql's ``loss_stop`` row) marks where the stop hit."""
    from analysis.tearsheet import mark_loss_stop

    ax.plot(_t_s(pnl["ts_recv"], t0), pnl["pnl"], lw=0.9, color="tab:purple", label="PnL")
    ax.axhline(0.0, color="0.6", lw=0.6)
    if loss_stop:
        mark_loss_stop(ax, loss_stop, t0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_ylabel("USDT")
    ax.set_xlabel("seconds from the first book")
    ax.set_title("PnL (mark to mid, after fees)")


def latency_medians_ms(lat: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Median ms per stage, per driver (stages not on a driver's path are 0)."""
    out: dict[str, dict[str, float]] = {}
    for driver in ("label", "kev", "requote"):
        sel = lat["driver"] == driver if len(lat.get("driver", [])) else np.zeros(0, bool)
        if not sel.any():
            continue
        row = {}
        for stage in STAGES:
            v = lat[f"{stage}_ns"][sel]
            v = v[np.isfinite(v)]
            row[stage] = float(np.median(v)) / 1e6 if v.size else 0.0
        out[f"{driver} ({int(sel.sum())})"] = row
    return out


LABEL_COLORS: Final = {"HOLD": "0.6", "LEAN_BUY": "tab:green", "LEAN_SELL": "tab:red", "EMERGENCY": "black"}


def plot_latency(ax: Any, lat: dict[str, np.ndarray]) -> None:
    """Stacked horizontal bars: median ms per stage for each kind of decision."""
    from analysis.tearsheet import STAGE_COLORS

    med = latency_medians_ms(lat)
    seen: set[str] = set()
    for y, name in enumerate(med):
        left = 0.0
        for stage in STAGES:
            w = med[name][stage]
            if w <= 0:  # not on this path (or a negative feed latency from a skewed local clock)
                continue
            ax.barh(y, w, left=left, color=STAGE_COLORS[stage], label=None if stage in seen else stage)
            seen.add(stage)
            left += w
    ax.set_yticks(range(len(med)), list(med))
    ax.set_xlabel("ms, median per stage (stages <= 0 are not drawn)")
    ax.set_title("per-decision latency: feed -> Laya -> Kev queue -> Kev -> risk/decide -> order -> fill")
    if seen:
        handles, names = ax.get_legend_handles_labels()
        pairs = sorted(zip(names, handles, strict=True), key=lambda p: STAGES.index(p[0]))  # path order
        ax.legend(
            [h for _, h in pairs],
            [n for n, _ in pairs],
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            fontsize=8,
        )


def plot_labels(ax: Any, counts: dict[str, int]) -> None:
    names = list(LABEL_COLORS) + [k for k in counts if k not in LABEL_COLORS]
    vals = [counts.get(k, 0) for k in names]
    ax.bar(names, vals, color=[LABEL_COLORS.get(k, "tab:gray") for k in names])
    ax.set_yscale("symlog")
    ax.set_title("Laya labels")
    for i, v in enumerate(vals):
        ax.annotate(str(v), (i, v), ha="center", va="bottom", fontsize=8)


def figures(run_dir: Path | str) -> dict[str, Any]:
    """The key plots of a run as matplotlib figures, by name."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from analysis.tearsheet import mark_loss_stop

    con = connect(run_dir)
    try:
        pnl = pnl_series(con, run_symbol(run_dir))
        fl = fills(con)
        lat = decision_latency(con)
        counts = label_counts(con)
        rel = con.sql("FROM loss_stop")
        stop = dict(zip(rel.columns, rel.fetchall()[0], strict=True))
    finally:
        con.close()
    t0 = float(pnl["ts_recv"][0]) if len(pnl["ts_recv"]) else 0.0
    figs: dict[str, Any] = {}
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True, constrained_layout=True)
    plot_mid_fills(axes[0], pnl, fl, t0)
    plot_inventory(axes[1], pnl, t0)
    plot_pnl(axes[2], pnl, t0, stop)
    mark_loss_stop(axes[0], stop, t0)
    mark_loss_stop(axes[1], stop, t0)
    figs["market"] = fig
    fig, ax = plt.subplots(figsize=(10, 3.2), constrained_layout=True)
    plot_latency(ax, lat)
    figs["latency"] = fig
    fig, ax = plt.subplots(figsize=(6, 3.2), constrained_layout=True)
    plot_labels(ax, counts)
    figs["labels"] = fig
    return figs


def _png_b64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table_html(s: Section) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in s.columns)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='t'>{html.escape(v)}</td>"
            if isinstance(v, str)
            else f"<td>{'' if v is None else html.escape(str(v))}</td>"
            for v in r
        )
        + "</tr>"
        for r in s.rows
    )
    return f"<h3>{html.escape(s.title)}</h3><table><tr>{head}</tr>{body}</table>"


_CSS: Final = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
    "table{border-collapse:collapse;margin-bottom:1em;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    "img{max-width:100%}code{font-size:12px}"
    ".warn{background:#fde8e8;border-left:4px solid #c00;padding:4px 8px;font-weight:600}"
    ".cfg{columns:3;font-family:monospace;font-size:12px;margin-bottom:1em}td.t{text-align:left}"
)


def check_html_path(path: Path | str) -> None:
    """:func:`analysis.report.check_output_file` for the HTML report."""
    check_output_file(path)


def write_html(run_dir: Path | str, out_path: Path | str) -> Path:
    """Write the run's tear sheet, plots and report tables to ``out_path``: one self-contained file
    (images inline as data: URIs, the style inline, no external reference)."""
    import matplotlib.pyplot as plt

    from analysis import portfolio, tearsheet
    from engine.store import atomic_write_bytes

    run = Path(run_dir)
    ts = tearsheet.compute(run)
    manifest = ts.manifest
    pf = portfolio.compute(run)
    figs = figures(run)
    figs.update(tearsheet.figures(ts))
    pf_figs = portfolio.figures(pf) if pf is not None else {}
    figs.update(pf_figs)
    try:
        images = {name: _png_b64(fig) for name, fig in figs.items()}
    finally:
        for fig in figs.values():
            plt.close(fig)
    sections = run_report(run)
    e = html.escape
    head = tearsheet.header_lines(ts)
    ts_sections = tearsheet.sections(ts)
    sym = manifest.get("config", {}).get("symbol")
    if pf is not None:  # as the console: the portfolio leads, the tear sheet is one leg's (report.py)
        head = [ln for ln in head if not ln.startswith(tearsheet.LOSS_STOP_PREFIXES)]
        head[:0] = portfolio.header_lines(pf, sym)
        ts_sections = [leg_titled(s, sym) for s in ts_sections]
    warn = [ln for ln in head if ln.startswith(("IN-SAMPLE", "LOSS STOP"))]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>dualhub run {e(run.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>dualhub run {e(run.name)}</h1>",
        *(f"<p class='warn'>{e(ln)}</p>" for ln in warn),
        f"<p>digest <code>{e(str(manifest.get('digest', '')))}</code><br>",
        f"session <code>{e(str(manifest.get('session', {}).get('path', '')))}</code></p>",
        "<ul class='head'>",
        *(f"<li>{e(ln)}</li>" for ln in head if ln not in warn and not ln.startswith("config: ")),
        "</ul><h3>config</h3><div class='cfg'>",
        *(f"<div><b>{e(k)}</b> {e(str(v))}</div>" for k, v in tearsheet._flat(manifest.get("config", {}))),
        "</div>",
    ]
    titles = {
        "equity": "Equity and drawdown",
        "pnl_split": "PnL split and round trips",
        "markouts": "Fee-adjusted markouts",
        "calibration": "Laya's calibration",
        "latency_cdf": "Per-stage latency CDFs",
        "market": "Mid, fills, inventory, PnL",
        "latency": "Latency breakdown (medians)",
        "labels": "Labels",
    }
    pf_titles = {
        "portfolio_pnl": "PnL per instrument and for the portfolio",
        "portfolio_exposure": "Net delta and gross exposure",
        "hedge_ratio": "Kev's hedge ratio against the realised beta",
        "risk_rules": "Which risk rule bound when",
        "hedge_fit": "The hub's hedge ratio against the truth (simulated) and a rolling estimate",
    }
    order = [n for n in titles if n in images] + [n for n in images if n not in titles and n not in pf_figs]

    def img(name: str, title: str) -> str:
        return f"<h2>{e(title)}</h2><img alt='{e(name)}' src='data:image/png;base64,{images[name]}'>"

    if pf is not None:
        parts.append("<h2>Portfolio</h2>")
        parts.extend(_table_html(s) for s in portfolio.sections(pf))
        parts.extend(img(name, pf_titles.get(name, name)) for name in pf_figs)
    parts.append("<h2>Tear sheet</h2>" if pf is None else f"<h2>Tear sheet: {e(str(sym))} alone</h2>")
    parts.extend(_table_html(s) for s in ts_sections)
    parts.extend(img(name, titles.get(name, name)) for name in order)
    parts.append("<h2>Report</h2>")
    parts.extend(_table_html(s) for s in sections)
    parts.append("</body></html>")
    out = Path(out_path)
    check_html_path(out)  # again: a caller from Python skips the command's early check
    try:
        atomic_write_bytes(out, "\n".join(parts).encode("utf-8"))
    except BaseException:  # a full disk or Ctrl-C: no half-written out.html.tmp left behind
        out.with_name(out.name + ".tmp").unlink(missing_ok=True)
        raise
    return out
