"""``dualhub report RUN --html OUT.html``: the key plots of a run in one self-contained HTML file.

Everything is read through the run's DuckDB views (:func:`engine.report.report.connect`): mid and
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

from engine.report.report import Section, _q, connect, run_report

NS_PER_S: Final = 1e9
STAGES: Final = ("feed", "laya", "kev_queue", "kev", "decide", "order_entry", "fill")

# One row per new order: what caused it (a Laya label, a Kev reply, or a requote after a cancel ack)
# and how long each step on its path took, in ns (NULL where the step is not on its path). ``fill`` is
# ack -> first fill (time resting in the book; 0 for an order filled on arrival).
DECISION_LATENCY_SQL: Final = """
WITH news AS (
    SELECT o.client_oid, o.order_type, o.side, o.ts_recv AS new_ns, t.start_ns AS origin_ns
    FROM "order" o JOIN latency t ON t.name = 'tick_to_order' AND t.ref = o.client_oid
    WHERE o.kind = 'new'
),
lab AS (SELECT book_ts_recv, min(seq) AS seq FROM label GROUP BY book_ts_recv),
kreq AS (SELECT ts_event, min(request_id) AS request_id FROM kev_request GROUP BY ts_event),
acks AS (SELECT client_oid, min(ts_recv) AS ack_ns FROM "order" WHERE kind = 'ack' GROUP BY client_oid),
fills AS (SELECT client_oid, min(ts_recv) AS fill_ns FROM fill GROUP BY client_oid)
SELECT
    n.client_oid, n.order_type, n.side, n.new_ns,
    CASE WHEN lab.seq IS NOT NULL THEN 'label' WHEN kreq.request_id IS NOT NULL THEN 'kev'
         ELSE 'requote' END AS driver,
    coalesce(l1.book_ts_recv - l1.ts_event, l2.book_ts_recv - l2.ts_event) AS feed_ns,
    coalesce(l1.ts_recv - l1.book_ts_recv, l2.ts_recv - l2.book_ts_recv) AS laya_ns,
    r.queue_wait_ns AS kev_queue_ns,
    kr.lag_ns AS kev_ns,
    n.new_ns - coalesce(l1.ts_recv, kr.ts_recv, n.origin_ns) AS decide_ns,
    a.ack_ns - n.new_ns AS order_entry_ns,
    greatest(f.fill_ns - coalesce(a.ack_ns, n.new_ns), 0) AS fill_ns
FROM news n
LEFT JOIN lab ON lab.book_ts_recv = n.origin_ns
LEFT JOIN label l1 ON l1.seq = lab.seq
LEFT JOIN kreq ON kreq.ts_event = n.origin_ns AND lab.seq IS NULL
LEFT JOIN kev_request r ON r.request_id = kreq.request_id
LEFT JOIN label l2 ON l2.seq = r.label_seq
LEFT JOIN kev_response kr ON kr.request_id = kreq.request_id
LEFT JOIN acks a ON a.client_oid = n.client_oid
LEFT JOIN fills f ON f.client_oid = n.client_oid
ORDER BY n.new_ns, n.client_oid
"""

# Mark-to-market at every book: cash (sells - buys - fees) and position from the fills so far.
PNL_SQL: Final = """
WITH f AS (
    SELECT ts_recv,
        sum(CASE WHEN side = 'buy' THEN qty ELSE -qty END)
            OVER (ORDER BY ts_recv, seq ROWS UNBOUNDED PRECEDING) AS position,
        sum(CAST(CASE WHEN side = 'sell' THEN notional ELSE -notional END AS DOUBLE) - CAST(fee AS DOUBLE))
            OVER (ORDER BY ts_recv, seq ROWS UNBOUNDED PRECEDING) AS cash,
        row_number() OVER (PARTITION BY ts_recv ORDER BY seq DESC) AS last_at_ts
    FROM fill
),
f_last AS (SELECT ts_recv, position, cash FROM f WHERE last_at_ts = 1),
b AS (SELECT ts_recv, seq, (bid_px_0 + ask_px_0) / 2 AS mid FROM books15 WHERE symbol = $symbol)
SELECT b.ts_recv, b.mid, coalesce(f_last.position, 0) AS position, coalesce(f_last.cash, 0) AS cash,
       coalesce(f_last.cash, 0) + coalesce(f_last.position, 0) * b.mid AS pnl
FROM b ASOF LEFT JOIN f_last ON b.ts_recv >= f_last.ts_recv
ORDER BY b.ts_recv, b.seq
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


def pnl_series(con: duckdb.DuckDBPyConnection, symbol: str) -> dict[str, np.ndarray]:
    """``ts_recv, mid, position, cash, pnl`` at every book of ``symbol``."""
    return fetch(con, PNL_SQL, symbol=symbol)


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
    for side, color, marker in (("buy", "tab:green", "^"), ("sell", "tab:red", "v")):
        sel = fl["side"] == side
        if sel.any():
            ax.scatter(_t_s(fl["ts_recv"][sel], t0), fl["px"][sel], s=12, c=color, marker=marker, label=side)
    ax.set_ylabel("price")
    ax.set_title("mid and fills")
    ax.legend(loc="best", fontsize=8)


def plot_inventory(ax: Any, pnl: dict[str, np.ndarray], t0: float) -> None:
    ax.step(_t_s(pnl["ts_recv"], t0), pnl["position"], where="post", lw=0.9, color="tab:blue")
    ax.axhline(0.0, color="0.6", lw=0.6)
    ax.set_ylabel("position")
    ax.set_title("inventory")


def plot_pnl(ax: Any, pnl: dict[str, np.ndarray], t0: float) -> None:
    ax.plot(_t_s(pnl["ts_recv"], t0), pnl["pnl"], lw=0.9, color="tab:purple")
    ax.axhline(0.0, color="0.6", lw=0.6)
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


STAGE_COLORS: Final = {
    "feed": "0.7",
    "laya": "tab:blue",
    "kev_queue": "tab:olive",
    "kev": "tab:orange",
    "decide": "tab:gray",
    "order_entry": "tab:green",
    "fill": "tab:red",
}
LABEL_COLORS: Final = {"HOLD": "0.6", "LEAN_BUY": "tab:green", "LEAN_SELL": "tab:red", "EMERGENCY": "black"}


def plot_latency(ax: Any, lat: dict[str, np.ndarray]) -> None:
    """Stacked horizontal bars: median ms per stage for each kind of decision."""
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
        ax.legend(loc="best", fontsize=8)


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

    con = connect(run_dir)
    try:
        pnl = pnl_series(con, run_symbol(run_dir))
        fl = fills(con)
        lat = decision_latency(con)
        counts = label_counts(con)
    finally:
        con.close()
    t0 = float(pnl["ts_recv"][0]) if len(pnl["ts_recv"]) else 0.0
    figs: dict[str, Any] = {}
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True, constrained_layout=True)
    plot_mid_fills(axes[0], pnl, fl, t0)
    plot_inventory(axes[1], pnl, t0)
    plot_pnl(axes[2], pnl, t0)
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
        "<tr>" + "".join(f"<td>{'' if v is None else html.escape(str(v))}</td>" for v in r) + "</tr>"
        for r in s.rows
    )
    return f"<h3>{html.escape(s.title)}</h3><table><tr>{head}</tr>{body}</table>"


_CSS: Final = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
    "table{border-collapse:collapse;margin-bottom:1em;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    "img{max-width:100%}code{font-size:12px}"
)


def write_html(run_dir: Path | str, out_path: Path | str) -> Path:
    """Write the run's plots and report tables to ``out_path`` (one file, images inline)."""
    import matplotlib.pyplot as plt

    from engine.store import atomic_write_bytes

    run = Path(run_dir)
    manifest = run_manifest(run)
    figs = figures(run)
    try:
        images = {name: _png_b64(fig) for name, fig in figs.items()}
    finally:
        for fig in figs.values():
            plt.close(fig)
    sections = run_report(run)
    model = manifest.get("model", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>dualhub run {html.escape(run.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>dualhub run {html.escape(run.name)}</h1>",
        f"<p>digest <code>{html.escape(str(manifest.get('digest', '')))}</code><br>",
        f"session <code>{html.escape(str(manifest.get('session', {}).get('path', '')))}</code><br>",
        f"model <code>{html.escape(str(model.get('file', '')))}</code> "
        f"(features {html.escape(str(model.get('feature_version', '')))})</p>",
    ]
    titles = {"market": "Mid, fills, inventory, PnL", "latency": "Latency breakdown", "labels": "Labels"}
    for name, b64 in images.items():
        parts.append(f"<h2>{titles.get(name, name)}</h2><img alt='{name}' src='data:image/png;base64,{b64}'>")
    parts.append("<h2>Report</h2>")
    parts.extend(_table_html(s) for s in sections)
    parts.append("</body></html>")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, "\n".join(parts).encode("utf-8"))
    return out
