"""The tear sheet of a run: performance, PnL split, round trips, markouts, Laya's calibration, latency.

One implementation for ``dualhub report RUN`` (console), ``--html`` and ``notebooks/11_tear_sheet``:
:func:`compute` reads a run through its DuckDB views (``views.sql``: ``equity``, ``equity_sampled``,
``performance``, ``pnl_attribution``, ``loss_stop``, ``markouts``, ``markout_stats``,
``latency_stages``) and adds what SQL says badly: round trips (:func:`round_trips`) and the
calibration of Laya's probabilities against the realised outcome (:func:`calibration`).
:func:`sections` gives its tables, :func:`header_lines` its header, :func:`figures` its plots.
docs/ANALYSIS.md ("Tear sheet") defines every number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson

from analysis.report import Section, _q, connect
from engine.events import Label
from engine.laya.labels import LabelConfig, triple_barrier_labels

SAMPLE_NS: Final = 1_000_000_000  # equity sampling for Sharpe / Sortino
MARKOUT_MS: Final = (0, 100, 1000, 5000, 30000)
CLASSES: Final = tuple(lab.name for lab in Label)
P_COLUMNS: Final = tuple(f"p_{c.lower()}" for c in CLASSES)
CAL_BINS: Final = 10
EPS: Final = 1e-12  # log-loss clips probabilities here: one confident miss is large, not infinite


# -- round trips ------------------------------------------------------------------------------------


# The colour of each latency stage in every plot of it (the tear sheet's and --html's).
STAGE_COLORS: Final = {
    "feed": "0.7",
    "laya": "tab:blue",
    "kev_queue": "tab:olive",
    "kev": "tab:orange",
    "decide": "tab:gray",
    "order_entry": "tab:green",
    "fill": "tab:red",
}

# What a stage is called where people read it: the view's order_entry_ns (the latency span
# "order_entry") runs from the order's send to its ack, the venue's entry and response latencies both,
# so with latency_order_entry=const:5ms it reads 10 ms; the name says so.
STAGE_LABEL = {"order_entry": "order_sent_to_ack"}


@dataclass(frozen=True)
class RoundTrip:
    """A position from flat to flat: ``side`` long or short, ``max_qty`` its largest size, ``pnl``
    (USDT, after fees) realised; ``closed`` False for the one still open at the end (its ``pnl``
    marked at the last mid, ``close_ns`` the run's end)."""

    open_ns: int
    close_ns: int
    side: str
    max_qty: float
    fills: int
    pnl: float
    closed: bool

    @property
    def holding_s(self) -> float:
        return (self.close_ns - self.open_ns) / 1e9


def round_trips(
    ts: Sequence[int],
    side: Sequence[str],
    qty: Sequence[float],
    px: Sequence[float],
    fee: Sequence[float],
    *,
    last_mid: float | None = None,
    end_ns: int | None = None,
) -> list[RoundTrip]:
    """Fills (in order) cut into round trips. A fill that crosses zero closes the trip with the part
    that flattens it and opens the next with the rest (its fee split by size). Positions are rounded
    to 1e-9 (float sums of sizes) to tell flat."""
    trips: list[RoundTrip] = []
    pos = cash = 0.0
    open_ns = n = 0
    max_qty = 0.0

    def close(at: int, c: float) -> None:
        trips.append(RoundTrip(open_ns, at, "long" if pos > 0 else "short", max_qty, n, c, True))

    for t, s, q, p, f in zip(ts, side, qty, px, fee, strict=True):
        sign = 1.0 if s == "buy" else -1.0
        new = round(pos + sign * q, 9)
        if pos == 0.0:
            open_ns, n, cash, max_qty = int(t), 0, 0.0, 0.0
        n += 1
        if pos != 0.0 and new != 0.0 and (new > 0) != (pos > 0):  # through zero
            part = abs(pos) / q
            close(int(t), cash - sign * p * abs(pos) - f * part)
            open_ns, n, cash, max_qty = int(t), 1, -sign * p * (q - abs(pos)) - f * (1 - part), abs(new)
        else:
            cash += -sign * p * q - f
            max_qty = max(max_qty, abs(new))
            if new == 0.0:
                close(int(t), cash)
        pos = new
    if pos != 0.0 and last_mid is not None:
        side_ = "long" if pos > 0 else "short"
        trips.append(
            RoundTrip(open_ns, int(end_ns or open_ns), side_, max_qty, n, cash + pos * last_mid, False)
        )
    return trips


def position_report(trips: Sequence[RoundTrip], span_ns: int) -> dict[str, Any]:
    """Closed round trips: count, win rate (pnl > 0), mean / median PnL and holding time; the share of
    the run spent holding a position (open trip included)."""
    closed = [t for t in trips if t.closed]
    pnl = np.array([t.pnl for t in closed], dtype=np.float64)
    hold = np.array([t.holding_s for t in closed], dtype=np.float64)
    held_ns = sum(t.close_ns - t.open_ns for t in trips)
    is_open = [t for t in trips if not t.closed]
    return {
        "round_trips": len(closed),
        "win_rate": float((pnl > 0).mean()) if pnl.size else None,
        "pnl_mean": float(pnl.mean()) if pnl.size else None,
        "pnl_median": float(np.median(pnl)) if pnl.size else None,
        "hold_mean_s": float(hold.mean()) if hold.size else None,
        "hold_median_s": float(np.median(hold)) if hold.size else None,
        "hold_max_s": float(hold.max()) if hold.size else None,
        "time_in_position": held_ns / span_ns if span_ns > 0 else None,
        "open_at_end": (
            f"{is_open[0].side} {is_open[0].max_qty:g} max, {is_open[0].pnl:+.4f} USDT marked"
            if is_open
            else ""
        ),
    }


# -- calibration ------------------------------------------------------------------------------------


def brier_log_loss(P: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Multi-class Brier score (mean over rows of the squared distance to the one-hot outcome, 0..2) and
    log-loss (mean of -ln p of the outcome, clipped at :data:`EPS`)."""
    P = np.asarray(P, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    if not y.size:
        return math.nan, math.nan
    onehot = np.eye(P.shape[1])[y]
    brier = float(((P - onehot) ** 2).sum(axis=1).mean())
    return brier, float(-np.log(np.clip(P[np.arange(y.size), y], EPS, 1.0)).mean())


def reliability(p: np.ndarray, hit: np.ndarray, bins: int = CAL_BINS) -> dict[str, np.ndarray]:
    """Equal-width probability bins over [0, 1]: per bin ``n``, mean predicted ``mean_p`` and observed
    frequency ``freq`` (NaN for an empty bin); ``edges`` has ``bins + 1`` values."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    b = np.clip(np.digitize(p, edges) - 1, 0, bins - 1)
    n = np.bincount(b, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.bincount(b, weights=p, minlength=bins) / n
        freq = np.bincount(b, weights=hit.astype(np.float64), minlength=bins) / n
    return {"edges": edges, "n": n, "mean_p": mean_p, "freq": freq}


@dataclass(frozen=True)
class Calibration:
    """Laya's labels of the run against the realised outcome of their books (see :func:`calibration`)."""

    config: LabelConfig
    P: np.ndarray  # (n, 4) probabilities, rows summing to 1
    y: np.ndarray  # realised outcome class
    pred: np.ndarray  # Laya's label
    without_outcome: int  # labels whose book has no full horizon (or a gap in it)

    def scores(self) -> dict[str, tuple[float, float]]:
        """(Brier, log-loss) of Laya's probabilities and of the base rate (the outcomes' frequencies)."""
        base = np.bincount(self.y, minlength=len(CLASSES)) / max(self.y.size, 1)
        return {
            "Laya": brier_log_loss(self.P, self.y),
            "base rate": brier_log_loss(np.tile(base, (self.y.size, 1)), self.y),
        }

    def per_label(self) -> list[tuple[str, int, float | None, float, float | None]]:
        """Per class: (label, times predicted, hit rate: outcome == label when predicted, outcome
        rate, mean predicted probability)."""
        out = []
        for i, name in enumerate(CLASSES):
            sel = self.pred == i
            hit = float((self.y[sel] == i).mean()) if sel.any() else None
            rate = float((self.y == i).mean()) if self.y.size else math.nan
            out.append((name, int(sel.sum()), hit, rate, float(self.P[:, i].mean()) if self.y.size else None))
        return out


def _session_files(manifest: dict[str, Any], stream: str) -> list[Path]:
    root = Path(manifest["session"]["path"])
    return sorted(root / k for k in manifest["session"].get("files", {}) if k.startswith(f"{stream}/"))


def calibration(con: Any, manifest: dict[str, Any], config: LabelConfig | None = None) -> Calibration:
    """Each ``label`` event's probabilities against its book's outcome on the replayed session: the
    triple-barrier label of :mod:`engine.laya.labels` (what Laya is trained to predict; ``config``
    defaults to ``LabelConfig()``, the training default: 2 s horizon, +-1.5 bps lean, 8 bps emergency
    with a volume burst), computed from the session's books, trades and gaps."""
    cfg = config or LabelConfig()
    # a replay's config names its symbol; a live run's config is LiveConfig (symbols), its manifest
    # names the run's one symbol at the top
    sym = manifest.get("config", {}).get("symbol") or manifest["symbol"]
    book = con.execute(
        "SELECT seq, ts_recv, (bid_px_0 + ask_px_0) / 2 AS mid FROM books15 WHERE symbol = $s "
        "ORDER BY ts_recv, seq",
        {"s": sym},
    ).fetchnumpy()
    trades = gaps = None
    if tf := [f for f in _session_files(manifest, "trade") if f.exists()]:
        trades = con.execute(
            f"SELECT ts_recv, px * sz AS notional FROM read_parquet([{', '.join(_q(f) for f in tf)}]) "
            "WHERE symbol = $s ORDER BY ts_recv, seq",
            {"s": sym},
        ).fetchnumpy()
    if gf := [f for f in _session_files(manifest, "gap") if f.exists()]:
        gaps = con.execute(
            f"SELECT ts_recv FROM read_parquet([{', '.join(_q(f) for f in gf)}]) WHERE symbol = $s",
            {"s": sym},
        ).fetchnumpy()["ts_recv"]
    truth = triple_barrier_labels(
        np.asarray(book["mid"], dtype=np.float64),
        np.asarray(book["ts_recv"], dtype=np.int64),
        cfg,
        trade_ts_ns=None if trades is None else np.asarray(trades["ts_recv"], dtype=np.int64),
        trade_notional=None if trades is None else np.asarray(trades["notional"], dtype=np.float64),
        exclude_ns=None if gaps is None else np.asarray(gaps, dtype=np.int64),
    )
    lab = con.execute(
        f"SELECT book_seq, label, {', '.join(P_COLUMNS)} FROM label WHERE symbol = $s ORDER BY seq",
        {"s": sym},
    ).fetchnumpy()
    row_of = {int(s): i for i, s in enumerate(np.asarray(book["seq"]).tolist())}
    idx = np.array([row_of.get(int(s), -1) for s in np.asarray(lab["book_seq"]).tolist()], dtype=np.int64)
    ok = idx >= 0
    ok[ok] = truth.valid[idx[ok]]
    P = np.column_stack([np.asarray(lab[c], dtype=np.float64) for c in P_COLUMNS])[ok]
    P = P / np.where(P.sum(axis=1, keepdims=True) > 0, P.sum(axis=1, keepdims=True), 1.0)
    names = np.asarray(lab["label"], dtype=object)[ok]
    pred = np.array([CLASSES.index(str(x)) for x in names], dtype=np.int64)
    return Calibration(cfg, P, truth.label[idx[ok]].astype(np.int64), pred, int((~ok).sum()))


# -- the tear sheet ---------------------------------------------------------------------------------


def _one(con: Any, sql: str) -> dict[str, Any]:
    rel = con.sql(sql)
    rows = rel.fetchall()
    return dict(zip(rel.columns, rows[0], strict=True)) if rows else dict.fromkeys(rel.columns)


def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


@dataclass
class TearSheet:
    run: Path
    manifest: dict[str, Any]
    sample_ns: int
    performance: dict[str, Any]
    attribution: dict[str, Any]
    loss_stop: dict[str, Any]
    equity: dict[str, np.ndarray]  # ts_recv, pnl, drawdown, position: at every book
    trips: list[RoundTrip]
    positions: dict[str, Any]
    markouts: list[dict[str, Any]]  # markout_stats rows
    calibration: Calibration | None
    latency_ms: dict[str, np.ndarray] = field(default_factory=dict)  # stage -> sorted durations

    @property
    def in_sample(self) -> bool:
        info = self.manifest.get("in_sample")
        return bool(isinstance(info, dict) and info.get("in_sample"))

    @property
    def span_ns(self) -> int:
        s, e = self.loss_stop.get("start_ns"), self.loss_stop.get("end_ns")
        return int(e - s) if s is not None and e is not None else 0


def compute(
    run_dir: Path | str,
    *,
    sample_ns: int = SAMPLE_NS,
    markout_ms: Sequence[float] = MARKOUT_MS,
    labels: LabelConfig | None = None,
) -> TearSheet:
    """Every tear-sheet number of a run (the run is checked against its manifest first)."""
    if sample_ns <= 0 or not markout_ms or any(not math.isfinite(h) or h < 0 for h in markout_ms):
        raise ValueError("sample_ns must be > 0 and markout horizons finite and >= 0")
    run = Path(run_dir)
    con = connect(run)
    try:
        manifest = orjson.loads((run / "manifest.json").read_bytes())
        con.execute(f"SET VARIABLE sample_ns = {int(sample_ns)}")
        con.execute(f"SET VARIABLE markout_ms = [{', '.join(repr(float(h)) for h in markout_ms)}]")
        perf = _one(con, "FROM performance")
        attr = _one(con, "FROM pnl_attribution")
        stop = _one(con, "FROM loss_stop")
        eq = con.execute(
            "SELECT ts_recv, pnl, drawdown, position FROM equity ORDER BY ts_recv, seq"
        ).fetchnumpy()
        fl = con.execute(
            "SELECT ts_recv, side, qty, px, CAST(fee AS DOUBLE) AS fee FROM fill "
            "WHERE symbol = getvariable('run_symbol') ORDER BY ts_recv, seq"
        ).fetchnumpy()
        last_mid = con.execute("SELECT mid FROM equity ORDER BY ts_recv DESC, seq DESC LIMIT 1").fetchall()
        trips = round_trips(
            fl["ts_recv"].tolist(),
            fl["side"].tolist(),
            fl["qty"].tolist(),
            fl["px"].tolist(),
            fl["fee"].tolist(),
            last_mid=last_mid[0][0] if last_mid else None,
            end_ns=stop.get("end_ns"),
        )
        marks = _rows(con, "FROM markout_stats")
        cal = (
            calibration(con, manifest, labels) if _one(con, "SELECT count(*) AS n FROM label")["n"] else None
        )
        lat = con.execute(
            "SELECT stage, list(dur_ns / 1e6 ORDER BY dur_ns) AS ms FROM latency_stages "
            "GROUP BY stage, stage_no "
            "ORDER BY stage_no"
        ).fetchall()
    finally:
        con.close()
    ts = TearSheet(
        run=run,
        manifest=manifest,
        sample_ns=int(sample_ns),
        performance=perf,
        attribution=attr,
        loss_stop=stop,
        equity={k: np.asarray(v) for k, v in eq.items()},
        trips=trips,
        positions={},
        markouts=marks,
        calibration=cal,
        latency_ms={s: np.asarray(v, dtype=np.float64) for s, v in lat},
    )
    ts.positions = position_report(trips, ts.span_ns)
    return ts


# -- text -------------------------------------------------------------------------------------------


def sampling_label(sample_ns: int) -> str:
    s = sample_ns / 1e9
    return f"{s / 60:g} min" if s >= 60 and s % 60 == 0 else f"{s:g} s"


def _r(x: Any, nd: int = 4) -> Any:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _ms(h: float) -> int | float:
    return int(h) if float(h).is_integer() else float(h)


def _flat(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, dict):
        return [kv for k, v in d.items() for kv in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix, d)]


LOSS_STOP_PREFIXES: Final = ("loss stop: ", "LOSS STOP hit at ")  # loss_stop_line's two forms


def loss_stop_line(stop: dict[str, Any]) -> str:
    if stop.get("stop_ns") is None:
        return "loss stop: not hit"
    frac = stop.get("after_frac")
    return (
        f"LOSS STOP hit at t={stop['stop_s']:.1f} s (the first 'loss_stop' risk rejection), "
        f"{100 * (frac or 0):.0f}% of the run after it: no new orders from then on"
    )


def header_lines(ts: TearSheet) -> list[str]:
    """The header: in-sample warning, loss stop, input quarantine, sampling, and the full config."""
    m = ts.manifest
    lines = []
    info = m.get("in_sample")
    if ts.in_sample:
        extra = ", ".join(f"{k}={v}" for k, v in info.items() if k != "in_sample")
        lines.append(
            "IN-SAMPLE: the model was trained on this session; its numbers say little about new data"
            + (f" ({extra})" if extra else "")
        )
    lines.append(loss_stop_line(ts.loss_stop))
    q = m.get("quarantine") or {}
    if q:
        total = sum(int(n) for reasons in q.values() for n in reasons.values())
        parts = ", ".join(f"{s}/{r} {n}" for s, reasons in q.items() for r, n in reasons.items())
        lines.append(f"input quarantine: {total} rows kept out of the replay ({parts})")
    else:
        lines.append("input quarantine: none")
    lines.append(
        f"sampling: Sharpe and Sortino from {sampling_label(ts.sample_ns)} changes of mark-to-mid equity; "
        "drawdown at every book"
    )
    model = m.get("model", {})
    lines.append(
        f"model: {model.get('file', '')} sha256 {str(model.get('sha256', ''))[:16]} "
        f"features {model.get('feature_version', '')}; seeds {orjson.dumps(m.get('seeds', {})).decode()}"
    )
    lines.append("config: " + "  ".join(f"{k}={v}" for k, v in _flat(m.get("config", {}))))
    return lines


def sections(ts: TearSheet) -> list[Section]:
    """The tear sheet's tables (console and HTML print them as they are)."""
    p, a, pos = ts.performance, ts.attribution, ts.positions
    span_h = ts.span_ns / 3.6e12 if ts.span_ns else None
    samp = sampling_label(ts.sample_ns)
    turnover = a.get("turnover_usdt") or 0.0
    annualised = f"x sqrt({samp} samples in 365 days)"
    if span_h is not None and span_h < 24:
        # scaled from minutes or hours to a year, a Sharpe says little about the strategy: say so beside it
        annualised += f"; from a {span_h * 60:.0f}-minute run: not meaningful"
    perf_rows = [
        ("PnL", _r(p.get("pnl")), "USDT, mark to mid at the last book, after fees"),
        ("max drawdown", _r(p.get("max_drawdown")), "USDT, from the running peak, at every book"),
        (f"Sharpe ({samp})", _r(p.get("sharpe_per_sample")), f"mean / stdev of {samp} equity changes"),
        ("Sharpe (annualised)", _r(p.get("sharpe_annualised"), 2), annualised),
        (f"Sortino ({samp})", _r(p.get("sortino_per_sample")), "mean / downside deviation (target 0)"),
        ("Sortino (annualised)", _r(p.get("sortino_annualised"), 2), annualised),
        ("turnover", _r(turnover, 2), f"USDT traded in {a.get('fills', 0)} fills"),
        ("turnover per hour", _r(turnover / span_h, 2) if span_h else None, "USDT"),
        ("samples", p.get("samples"), f"{samp} equity changes"),
    ]
    split = [
        ("spread capture", _r(a.get("spread_capture")), "the fills' edge against the mid at the fill"),
        ("inventory", _r(a.get("inventory")), "mark to market of the position held (mid moves)"),
        ("fees", _r(a.get("fees")), "paid (negative)"),
        ("total", _r(a.get("total")), "= PnL"),
    ]
    position = [
        ("round trips (flat to flat)", pos["round_trips"], ""),
        ("win rate", _r(pos["win_rate"], 3), "share of round trips with PnL > 0 after fees"),
        ("PnL per round trip, mean", _r(pos["pnl_mean"]), "USDT"),
        ("PnL per round trip, median", _r(pos["pnl_median"]), "USDT"),
        ("holding time, mean", _r(pos["hold_mean_s"], 2), "s"),
        ("holding time, median", _r(pos["hold_median_s"], 2), "s"),
        ("holding time, max", _r(pos["hold_max_s"], 2), "s"),
        ("time in a position", _r(pos["time_in_position"], 3), "share of the run"),
        ("open at the end", pos["open_at_end"] or "flat", ""),
    ]
    out = [
        Section(
            "performance",
            f"Performance (Sharpe and Sortino at {samp} sampling)",
            ["metric", "value", "what"],
            perf_rows,
        ),
        Section("pnl_split", "PnL split (USDT)", ["component", "usdt", "what"], split),
        Section("positions", "Round trips and positions", ["metric", "value", "unit"], position),
        Section(
            "markouts",
            "Fee-adjusted markouts (bps, + = the fill made money; 95% CI, normal approximation)",
            ["liquidity", "horizon_ms", "n", "mean_bps", "ci95_lo_bps", "ci95_hi_bps", "fee_bps"],
            [
                (
                    r["liquidity"],
                    _ms(r["h_ms"]),
                    r["n"],
                    _r(r["mean_bps"], 3),
                    _r(r["ci95_lo_bps"], 3),
                    _r(r["ci95_hi_bps"], 3),
                    _r(r["fee_bps"], 3),
                )
                for r in ts.markouts
            ],
        ),
    ]
    cal = ts.calibration
    if cal is not None:
        h = cal.config.horizon_ns / 1e6
        out.append(
            Section(
                "calibration",
                f"Laya on the replayed session: outcome = triple-barrier label ({h:g} ms, "
                f"+-{cal.config.lean_bps:g} bps, emergency {cal.config.emergency_bps:g} bps); "
                f"{cal.y.size} labels, {cal.without_outcome} without an outcome",
                ["label", "predicted", "hit_rate", "outcome_rate", "mean_p"],
                [(n, k, _r(hit, 3), _r(rate, 3), _r(mp, 3)) for n, k, hit, rate, mp in cal.per_label()],
            )
        )
        out.append(
            Section(
                "calibration_scores",
                "Calibration scores (lower is better; the base rate always predicts the outcome frequencies)",
                ["predictor", "brier", "log_loss"],
                [(k, _r(b), _r(ll)) for k, (b, ll) in cal.scores().items()],
            )
        )
    out.append(
        Section(
            "latency_cdf",
            "Per-stage latency of the orders sent (ms quantiles): n counts the orders whose path has the "
            "stage, so kev and kev_queue count only the orders a Kev request led to (every request: "
            "the per-decision table); order_sent_to_ack is entry plus response latency; "
            "fill: filled orders only",
            ["stage", "n", "p10", "p25", "p50", "p75", "p90", "p99", "max"],
            [
                (
                    STAGE_LABEL.get(s, s),
                    v.size,
                    *(_r(np.quantile(v, q), 3) for q in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)),
                    _r(v.max(), 3),
                )
                for s, v in ts.latency_ms.items()
                if v.size
            ],
        )
    )
    return out


# -- plots ------------------------------------------------------------------------------------------


def mark_loss_stop(ax: Any, stop: dict[str, Any], t0_ns: float) -> None:
    """A red line at the first loss-stop rejection, the rest of the run shaded."""
    if stop.get("stop_ns") is None:
        return
    x = (stop["stop_ns"] - t0_ns) / 1e9
    ax.axvline(
        x,
        color="tab:red",
        lw=1.0,
        ls="--",
        label=f"loss stop ({100 * (stop.get('after_frac') or 0):.0f}% after)",
    )
    if stop.get("end_ns") is not None:
        ax.axvspan(x, (stop["end_ns"] - t0_ns) / 1e9, color="tab:red", alpha=0.06, lw=0)


def figures(ts: TearSheet) -> dict[str, Any]:
    """The tear sheet's plots as matplotlib figures, by name."""
    import matplotlib.pyplot as plt  # the caller's backend: inline in a notebook, Agg for --html
    from matplotlib.ticker import MaxNLocator

    figs: dict[str, Any] = {}
    eq = ts.equity
    t0 = float(ts.loss_stop.get("start_ns") or (eq["ts_recv"][0] if len(eq["ts_recv"]) else 0))
    t = (eq["ts_recv"].astype(np.float64) - t0) / 1e9

    fig, ax = plt.subplots(
        2, 1, figsize=(10, 5.5), sharex=True, constrained_layout=True, height_ratios=[2, 1]
    )
    ax[0].plot(t, eq["pnl"], lw=0.9, color="tab:purple", label="equity (PnL, mark to mid)")
    ax[0].axhline(0, color="0.6", lw=0.6)
    mark_loss_stop(ax[0], ts.loss_stop, t0)
    ax[0].set_ylabel("USDT")
    ax[0].set_title(f"equity; max drawdown {ts.performance.get('max_drawdown') or 0:.2f} USDT")
    ax[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax[1].fill_between(t, eq["drawdown"], 0, color="tab:red", alpha=0.4, lw=0, step="post")
    mark_loss_stop(ax[1], ts.loss_stop, t0)
    ax[1].set_ylabel("drawdown (USDT)")
    ax[1].set_xlabel("seconds from the first book")
    figs["equity"] = fig

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.2), constrained_layout=True)
    a = ts.attribution
    names = ["spread capture", "inventory", "fees", "total"]
    vals = [a.get("spread_capture") or 0, a.get("inventory") or 0, a.get("fees") or 0, a.get("total") or 0]
    ax[0].barh(names, vals, color=["tab:green", "tab:blue", "tab:red", "tab:purple"])
    ax[0].axvline(0, color="0.5", lw=0.6)
    ax[0].invert_yaxis()
    ax[0].set_xlabel("USDT")
    ax[0].set_title("PnL split")
    closed = [tr for tr in ts.trips if tr.closed]
    if closed:
        hold = np.array([tr.holding_s for tr in closed])
        win = np.array([tr.pnl > 0 for tr in closed])
        edges = np.histogram_bin_edges(hold, bins=30)
        ax[1].hist(
            [hold[win], hold[~win]],
            bins=edges,
            stacked=True,
            color=["tab:green", "tab:red"],
            label=["won", "lost"],
        )
        ax[1].legend(fontsize=8, framealpha=0.8)
    ax[1].yaxis.set_major_locator(MaxNLocator(integer=True))
    ax[1].set_xlabel("holding time (s)")
    ax[1].set_ylabel("round trips")
    ax[1].set_title(f"{len(closed)} round trips, win rate {100 * (ts.positions['win_rate'] or 0):.0f}%")
    figs["pnl_split"] = fig

    if ts.markouts:
        fig, ax = plt.subplots(figsize=(10, 3.4), constrained_layout=True)
        hs = sorted({r["h_ms"] for r in ts.markouts})
        xi = {h: i for i, h in enumerate(hs)}
        groups = sorted({r["liquidity"] for r in ts.markouts}, key=lambda g: (g == "all", g))
        width = 0.8 / len(groups)
        for k, g in enumerate(groups):
            rs = [r for r in ts.markouts if r["liquidity"] == g]
            x = np.array([xi[r["h_ms"]] for r in rs]) + (k - (len(groups) - 1) / 2) * width
            m = np.array([r["mean_bps"] for r in rs], dtype=float)
            lo = np.array([np.nan if r["ci95_lo_bps"] is None else r["ci95_lo_bps"] for r in rs], dtype=float)
            hi = np.array([np.nan if r["ci95_hi_bps"] is None else r["ci95_hi_bps"] for r in rs], dtype=float)
            ax.errorbar(
                x,
                m,
                yerr=[np.nan_to_num(m - lo), np.nan_to_num(hi - m)],
                fmt="o",
                capsize=3,
                label=f"{g} (n={max(r['n'] for r in rs)})",
            )
        ax.axhline(0, color="0.6", lw=0.6)
        ax.set_xticks(range(len(hs)), [f"{_ms(h)} ms" for h in hs])
        ax.set_xlabel("horizon after the fill")
        ax.set_ylabel("bps after fees")
        ax.set_title("fee-adjusted markouts, mean and 95% CI")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        figs["markouts"] = fig

    cal = ts.calibration
    if cal is not None and cal.y.size:
        fig, axes = plt.subplots(1, len(CLASSES), figsize=(12, 3.4), constrained_layout=True)
        for i, (ax, name) in enumerate(zip(axes, CLASSES, strict=True)):
            rel = reliability(cal.P[:, i], cal.y == i)
            has = rel["n"] > 0
            ax.plot([0, 1], [0, 1], color="0.7", ls="--", lw=0.8)
            ax.plot(rel["mean_p"][has], rel["freq"][has], color="tab:blue", lw=0.8, marker="o", ms=3)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_title(f"{name} (rate {np.mean(cal.y == i):.2f})", fontsize=9)
            ax.set_xlabel("predicted p")
            ax2 = ax.twinx()
            ax2.bar(
                rel["edges"][:-1], rel["n"], width=np.diff(rel["edges"]), align="edge", color="0.85", zorder=0
            )
            ax2.set_yscale("symlog")
            ax2.set_yticks([])
            ax.set_zorder(ax2.get_zorder() + 1)
            ax.patch.set_visible(False)
        axes[0].set_ylabel("observed frequency")
        b, ll = cal.scores()["Laya"]
        fig.suptitle(
            f"reliability (grey: labels per bin, log scale); Brier {b:.4f}, log-loss {ll:.4f}", fontsize=10
        )
        figs["calibration"] = fig

    if ts.latency_ms:
        fig, ax = plt.subplots(figsize=(10, 3.6), constrained_layout=True)
        for s, v in ts.latency_ms.items():
            if v.size:
                ax.step(
                    v,
                    np.arange(1, v.size + 1) / v.size,
                    where="post",
                    color=STAGE_COLORS.get(s),
                    label=f"{s} (n={v.size})",
                )
        allv = np.concatenate([v for v in ts.latency_ms.values() if v.size] or [np.zeros(1)])
        if (allv <= 0).any():
            ax.set_xscale("symlog", linthresh=0.01)
        else:
            ax.set_xscale("log")
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("ms")
        ax.set_ylabel("share of decisions <= x")
        ax.set_title("per-stage latency CDF (the fill stage: filled orders only)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        figs["latency_cdf"] = fig
    return figs
