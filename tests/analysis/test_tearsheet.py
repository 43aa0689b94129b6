"""The tear sheet (analysis/tearsheet.py and its views) against a hand-built run whose answers are
worked out by hand; the loss-stop column and note of sweeps, the sweep plot; console tables that
never cut a column.

Books every second, t = 0..10 s, mid (spread 1): 100 101 102 101 99 100 100 100 100 100 100.
Fills (maker, fee 2 bps of notional; mid = the last book at or before the fill):
  F1 0.5 s buy  1 @  99.5  mid 100  edge +0.5  fee 0.0199
  F2 2.5 s sell 1 @ 102.5  mid 102  edge +0.5  fee 0.0205  -> round trip 1: long, 2 s, +2.9596
  F3 3.5 s sell 2 @ 100.5  mid 101  edge -1.0  fee 0.0402
  F4 5.5 s buy  1 @ 101.5  mid 100  edge -1.5  fee 0.0203
  F5 6.5 s buy  2 @ 100.5  mid 100  edge -1.0  fee 0.0402  -> crosses zero: round trip 2 (short, 3 s)
        closes with 1 of it (half its fee): 201 - 101.5 - 100.5 - (0.0402 + 0.0203 + 0.0201) = -1.0806;
        the other 1 opens round trip 3 (long), open at the end: -100.5 - 0.0201 + 100 = -0.5201.
Equity at the books (cash + position * mid): 0, 1.4801, 2.4801, 2.9596, 5.9194, 3.9194, 2.3991, then
1.3589 to the end. Peak 5.9194, max drawdown 1.3589 - 5.9194 = -4.5605.
PnL split: spread -2.5, inventory (each fill's signed size x (100 - its mid)) +2 +2 = 4, fees -0.1411.
Risk: a max_position rejection at 1 s, loss_stop rejections at 7.5 s and 8.5 s: 25% of the run after.
"""

from __future__ import annotations

import io
import math
from decimal import Decimal

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from analysis import tearsheet
from analysis.console import print_report
from analysis.report import Section, print_table
from engine.eventlog import RUN_SCHEMA_VERSION, EventLog
from engine.events import STREAMS, Fill, LabelEvent, RiskDecision, events_to_table
from engine.laya.labels import LabelConfig
from engine.store import sha256_file
from tests.helpers import make_book

T0 = 1_700_000_000_000_000_000
S = 1_000_000_000
MIDS = [100, 101, 102, 101, 99, 100, 100, 100, 100, 100, 100]
FILLS = [(0.5, "buy", 1, "99.5"), (2.5, "sell", 1, "102.5"), (3.5, "sell", 2, "100.5"),
         (5.5, "buy", 1, "101.5"), (6.5, "buy", 2, "100.5")]  # fmt: skip
EQUITY = [0, 1.4801, 2.4801, 2.9596, 5.9194, 3.9194, 2.3991, 1.3589, 1.3589, 1.3589, 1.3589]
# Laya's label per book, each with p = 0.7 on it and 0.1 on the others; the outcomes (triple barrier,
# 1 s horizon, +-50 bps lean, 150 bps emergency, no trades so no volume rule) of books 0..9 are
# LB LB LS EM LB H H H H H (book 10 has no full horizon).
PRED = ["LEAN_BUY", "LEAN_SELL", "LEAN_SELL", "HOLD", "LEAN_BUY", "HOLD", "HOLD", "LEAN_BUY", "HOLD", "HOLD",
        "HOLD"]  # fmt: skip
OUTCOME = [
    "LEAN_BUY",
    "LEAN_BUY",
    "LEAN_SELL",
    "EMERGENCY",
    "LEAN_BUY",
    "HOLD",
    "HOLD",
    "HOLD",
    "HOLD",
    "HOLD",
]
CAL = LabelConfig(horizon_ns=S, lean_bps=50.0, emergency_bps=150.0)


def write_run(root, *, config_extra: dict | None = None, in_sample: bool | None = None):
    session, run = root / "session", root / "run"
    (session / "books15").mkdir(parents=True)
    (run / "events").mkdir(parents=True)
    books = [make_book(m - 0.5, m + 0.5, ts=T0 + i * S, seq=i) for i, m in enumerate(MIDS)]
    book_file = session / "books15" / "part-00000.parquet"
    pq.write_table(events_to_table(books, "books15"), book_file)
    log = EventLog(run / "events")
    for i, name in enumerate(PRED):
        p = {f"p_{c.lower()}": 0.7 if c == name else 0.1 for c in tearsheet.CLASSES}
        log.emit(LabelEvent, ts_event=T0 + i * S, ts_recv=T0 + i * S + 1, symbol="BTCUSDT", book_seq=i,
                 book_ts_recv=T0 + i * S, label=name, **p)  # fmt: skip
    for t, side, qty, px in FILLS:
        notional = Decimal(px) * qty
        log.emit(Fill, ts_event=T0 + int(t * S), ts_recv=T0 + int(t * S), client_oid=f"dh-{t}",
                 symbol="BTCUSDT",
                 side=side, px=float(px), qty=float(qty), liquidity="maker", notional=notional,
                 fee=notional * Decimal("0.0002"), position_after=0.0)  # fmt: skip
    for t, reason in ((1.0, "max_position"), (7.5, "loss_stop"), (8.5, "loss_stop")):
        log.emit(RiskDecision, ts_event=T0 + int(t * S), ts_recv=T0 + int(t * S), client_oid="x",
                 symbol="BTCUSDT",
                 intent="new", side="buy", order_type="limit", px=100.0, qty=1.0, source="quote",
                 advice_age_ns=-1, accepted=False, reason=reason)  # fmt: skip
    files = log.write()
    q = run / "events" / "input_quarantine.parquet"
    pq.write_table(STREAMS["input_quarantine"].schema.empty_table(), q)
    files["events/input_quarantine.parquet"] = {"rows": 0, "sha256": sha256_file(q)}
    manifest = {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "digest": log.digest,
        "config": {"symbol": "BTCUSDT", "risk": {"daily_loss_stop_usd": 100.0}, **(config_extra or {})},
        "files": files,
        "quarantine": {"books15": {"crossed": 3, "nan_price": 1}},
        "session": {
            "path": str(session),
            "files": {"books15/part-00000.parquet": {"rows": len(MIDS), "sha256": sha256_file(book_file)}},
        },
    }
    if in_sample is not None:
        manifest["in_sample"] = {"in_sample": in_sample, "sessions": 1}
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    return write_run(tmp_path_factory.mktemp("tearsheet"), in_sample=True)


@pytest.fixture(scope="module")
def ts(run):
    return tearsheet.compute(run, markout_ms=(0, 1000, 5000), labels=CAL)


def test_equity_drawdown_and_pnl_split(ts) -> None:
    assert ts.equity["pnl"].tolist() == pytest.approx(EQUITY, abs=1e-9)
    assert ts.performance["max_drawdown"] == pytest.approx(1.3589 - 5.9194)
    assert ts.performance["pnl"] == pytest.approx(1.3589)
    a = ts.attribution
    assert (a["spread_capture"], a["inventory"], a["fees"]) == pytest.approx((-2.5, 4.0, -0.1411))
    assert a["total"] == pytest.approx(ts.performance["pnl"])
    assert a["turnover_usdt"] == pytest.approx(99.5 + 102.5 + 201 + 101.5 + 201) and a["fills"] == 5


def test_sharpe_and_sortino_at_the_stated_sampling(run, ts) -> None:
    r = np.diff(EQUITY)  # 1 s samples: the books fall on whole seconds
    assert ts.performance["samples"] == 10 and ts.sample_ns == S
    assert ts.performance["sharpe_per_sample"] == pytest.approx(r.mean() / r.std(ddof=1))
    sortino = r.mean() / math.sqrt(np.mean(np.minimum(r, 0) ** 2))
    assert ts.performance["sortino_per_sample"] == pytest.approx(sortino)
    assert ts.performance["sharpe_annualised"] == pytest.approx(
        r.mean() / r.std(ddof=1) * math.sqrt(365 * 86400)
    )
    # at 2 s: samples at 0, 2, .. 10 s
    r2 = np.diff(EQUITY[::2])
    two = tearsheet.compute(run, sample_ns=2 * S, labels=CAL)
    assert two.performance["samples"] == 5
    assert two.performance["sharpe_per_sample"] == pytest.approx(r2.mean() / r2.std(ddof=1))
    assert any(s.title.startswith("Performance (Sharpe and Sortino at 2 s") for s in tearsheet.sections(two))


def test_round_trips_and_position_report(ts) -> None:
    rt = ts.trips
    assert [(t.side, t.closed, t.fills, t.max_qty) for t in rt] == [
        ("long", True, 2, 1.0),
        ("short", True, 3, 2.0),
        ("long", False, 1, 1.0),
    ]
    assert [t.pnl for t in rt] == pytest.approx([2.9596, -1.0806, -0.5201])
    assert [t.holding_s for t in rt] == pytest.approx([2.0, 3.0, 3.5])
    p = ts.positions
    assert p["round_trips"] == 2 and p["win_rate"] == 0.5
    assert p["pnl_mean"] == pytest.approx((2.9596 - 1.0806) / 2) and p["hold_median_s"] == pytest.approx(2.5)
    assert p["time_in_position"] == pytest.approx(8.5 / 10)
    assert p["open_at_end"].startswith("long 1 max")


def test_round_trips_through_zero_and_open_at_the_end() -> None:
    # buy 1 @ 10, sell 3 @ 11 (closes the long with a third of it and its fee, opens short 2), buy 1 @ 9
    args = ([0, S, 2 * S], ["buy", "sell", "buy"], [1.0, 3.0, 1.0], [10.0, 11.0, 9.0], [0.3, 0.6, 0.0])
    rt = tearsheet.round_trips(*args)  # no last mid: the open short is not reported
    assert [(t.side, t.closed) for t in rt] == [("long", True)] and rt[0].pnl == pytest.approx(1 - 0.3 - 0.2)
    rt = tearsheet.round_trips(*args, last_mid=8.0, end_ns=5 * S)
    assert [(t.side, t.closed, t.max_qty) for t in rt[1:]] == [("short", False, 2.0)]
    assert rt[1].pnl == pytest.approx(2 * 11 - 0.4 - 9 - 8) and rt[1].holding_s == 4.0


def test_fee_adjusted_markouts_with_counts_and_intervals(ts) -> None:
    by = {(r["liquidity"], r["h_ms"]): r for r in ts.markouts}
    for h in (0, 1000, 5000):
        vals = []
        for t, side, _, px in FILLS:
            at = t + h / 1000
            if at > 10:  # past the run's last book: no markout
                continue
            mid, p = MIDS[int(at)], float(px)
            vals.append(((mid - p) if side == "buy" else (p - mid)) / p * 1e4 - 2.0)
        v = np.array(vals)
        r = by["all", h]
        assert r["n"] == len(v) == {0: 5, 1000: 5, 5000: 3}[h]
        half = 1.96 * v.std(ddof=1) / math.sqrt(len(v))
        assert (r["mean_bps"], r["ci95_lo_bps"], r["ci95_hi_bps"]) == pytest.approx(
            (v.mean(), v.mean() - half, v.mean() + half)
        )
        assert r["fee_bps"] == pytest.approx(2.0) and by["maker", h]["n"] == r["n"]


def test_brier_and_log_loss_on_a_tiny_example() -> None:
    P = np.array([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    brier, ll = tearsheet.brier_log_loss(P, np.array([0, 2]))
    assert brier == pytest.approx((0.09 + 0.03 + 3 * 0.0625 + 0.5625) / 2)
    assert ll == pytest.approx(-(math.log(0.7) + math.log(0.25)) / 2)
    rel = tearsheet.reliability(np.array([0.05, 0.15, 0.12, 0.95]), np.array([0, 1, 0, 1]), bins=10)
    assert rel["n"].tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 0, 1]
    assert rel["freq"][1] == 0.5 and rel["mean_p"][1] == pytest.approx(0.135) and np.isnan(rel["freq"][2])


def test_calibration_against_the_realised_outcome(ts) -> None:
    cal = ts.calibration
    assert cal.without_outcome == 1
    assert [tearsheet.CLASSES[i] for i in cal.y] == OUTCOME
    per = {name: (n, hit) for name, n, hit, _, _ in cal.per_label()}
    assert per["LEAN_BUY"] == (3, pytest.approx(2 / 3)) and per["LEAN_SELL"] == (2, 0.5)
    assert per["HOLD"] == (5, 0.8) and per["EMERGENCY"] == (0, None)
    brier, ll = cal.scores()["Laya"]  # 7 hits (0.12 each), 3 misses (1.32 each)
    assert brier == pytest.approx((7 * 0.12 + 3 * 1.32) / 10)
    assert ll == pytest.approx(-(7 * math.log(0.7) + 3 * math.log(0.1)) / 10)


def test_header_loss_stop_in_sample_quarantine_and_config(ts, tmp_path) -> None:
    assert ts.loss_stop["stop_s"] == pytest.approx(7.5) and ts.loss_stop["after_frac"] == pytest.approx(0.25)
    head = tearsheet.header_lines(ts)
    assert head[0].startswith("IN-SAMPLE") and "sessions=1" in head[0]
    assert "LOSS STOP hit at t=7.5 s" in head[1] and "25% of the run after it" in head[1]
    assert "input quarantine: 4 rows" in head[2] and "books15/crossed 3" in head[2]
    assert "risk.daily_loss_stop_usd=100.0" in head[-1] and "symbol=BTCUSDT" in head[-1]
    # no in_sample field (older runs), or false: no flag
    plain = tearsheet.compute(write_run(tmp_path), labels=CAL)
    assert not plain.in_sample and not any("IN-SAMPLE" in ln for ln in tearsheet.header_lines(plain))


def test_the_console_never_cuts_a_column(run, monkeypatch) -> None:
    from rich.console import Console

    monkeypatch.setenv("COLUMNS", "40")
    buf = io.StringIO()
    console = Console(file=buf)
    assert console.width == 40
    wide = Section("w", "a wide table", [f"column_number_{i}_with_a_long_name" for i in range(8)],
                   [tuple(f"value-{i}-{'x' * 20}" for i in range(8))])  # fmt: skip
    print_table(console, wide)
    sections = print_report(run, console=console)
    out = buf.getvalue()
    assert "…" not in out and "..." not in out
    assert console.width == 40  # restored after each wide table
    every = [wide, *sections, *tearsheet.sections(tearsheet.compute(run))]
    for s in every:
        if not s.rows:  # an empty table is one line saying so, not a bare header
            assert f"{s.title}: none" in out
            continue
        for c in s.columns:
            assert c in out, f"header {c!r} of {s.name} cut"
        for r in s.rows:
            for v in r:
                assert v is None or str(v) in out, f"{v!r} of {s.name} cut"
    assert "LOSS STOP hit at t=7.5 s" in out


def test_sweep_loss_stop_column_note_and_plot(run, tmp_path) -> None:
    from analysis.sweep_plot import plot_sweep
    from replay.sweep import RESULT_SCHEMA, loss_stop_note, results_table, run_stats

    stats = run_stats(run)
    assert stats["loss_stop_at_frac"] == pytest.approx(0.25)
    assert stats["max_drawdown_usdt"] == pytest.approx(1.3589 - 5.9194)
    assert "loss_stop_at_frac" in RESULT_SCHEMA.names

    def row(seed: int, x: float, frac: float | None, pnl: float) -> dict:
        return {"error": "", "session": "s", "p_seed": seed, "p_scale_kev": x, "loss_stop_at_frac": frac,
                "pnl_usdt": Decimal(str(pnl)), "fills": 10 + seed, "max_drawdown_usdt": -1.0}  # fmt: skip

    rows = [row(s, x, f, -100.0 + s) for s in (1, 2, 3) for x, f in ((0.5, 0.8), (1.0, 0.7), (2.0, None))]
    note = loss_stop_note(rows)
    assert note.startswith("loss stop hit in 6 of 9 runs, 6 of them in their first half")
    assert "DOMINATED" in note
    late = [{**r, "loss_stop_at_frac": 0.1 if r["loss_stop_at_frac"] else None} for r in rows]
    assert (
        "DOMINATED" not in loss_stop_note(late)
        and loss_stop_note([{**r, "loss_stop_at_frac": None} for r in rows]) == ""
    )
    assert results_table([{**r, "param_hash": "h"} for r in rows]).column("loss_stop_at_frac").null_count == 3

    out = plot_sweep(rows, tmp_path / "sweep.png", metrics=("pnl_usdt", "fills"))
    from PIL import Image

    im = np.asarray(Image.open(out).convert("L"), dtype=float)
    assert im.shape[1] > 500 and im.std() > 5  # drawn, not blank
    with pytest.raises(Exception, match="no parameter 'nope'"):
        plot_sweep(rows, tmp_path / "x.png", x="nope")
    assert not (tmp_path / "x.png").exists()
