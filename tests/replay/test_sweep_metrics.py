"""Metrics-only sweep runs: the digest and summary row of a run that writes no event log, equal to the
run written in full; --keep-logs, --best, and a row's replay_command replaying to its digest."""

import shlex

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.report import connect, load_queries
from dualhub.cli import main
from engine.risk import RiskLimits
from replay.config import ReplayConfig
from replay.driver import run_replay
from replay.run_metrics import book_rows_met, max_drawdown, sharpe
from replay.sweep import RESULT_SCHEMA, best_table, run_one, run_stats
from venue.simulator import simulate_session

GRID = """
[base]
laya_provider = "cpu"
"risk.daily_loss_stop_usd" = 1e9

[grid]
seed = [1, 2]
scale_kev = [0.5, 2]
"""
METRICS = [
    c
    for c in RESULT_SCHEMA.names
    if c not in ("run_dir", "log_kept", "wall_s", "peak_rss_mb", "peak_rss_scope", "worker", "market_cache")
]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return simulate_session(tmp_path_factory.mktemp("sim") / "s", minutes=1.0, seed=7)


def test_a_metrics_only_row_is_the_row_of_the_run_written_in_full(session, tmp_path):
    params = {"seed": 4, "laya_provider": "cpu", "scale_kev": 0.5, "risk.daily_loss_stop_usd": 1e9}
    light = run_one(str(session), params, runs_dir=str(tmp_path / "a"), keep_log=False)
    full = run_one(str(session), params, runs_dir=str(tmp_path / "b"), keep_log=True, market_cache=False)
    assert light["error"] == full["error"] == ""
    assert not (tmp_path / "a").exists()  # nothing written: no run directory, no event log
    assert (light["log_kept"], full["log_kept"], light["run_dir"]) == (False, True, "")
    assert full["fills"] > 0 and full["orders"] > 0 and full["risk_rejections"] > 0
    assert {c: light[c] for c in METRICS if c != "replay_command"} == {
        c: full[c] for c in METRICS if c != "replay_command"
    }
    refusals = orjson.loads(light["refusals"])
    assert sum(refusals.values()) == light["risk_rejections"]
    # the split adds up to the PnL marked at the last mid (float sums of exact decimals)
    total = light["spread_capture_usdt"] + light["inventory_usdt"] + light["fees_paid_usdt"]
    assert total == pytest.approx(float(light["pnl_usdt"]), abs=1e-3)
    assert light["tick_to_order_p50_ms"] <= light["tick_to_order_p99_ms"]


def test_the_rows_sharpe_and_drawdown_are_the_views(session, tmp_path):
    cfg = ReplayConfig(seed=2, laya_provider="cpu", risk=RiskLimits(daily_loss_stop_usd=1e9))
    res = run_replay(session, cfg, out_dir=tmp_path / "run")
    con = connect(res.run_dir)
    try:
        (want,) = con.sql("SELECT sharpe_annualised FROM performance").fetchall()[0]
        ((dd,),) = con.sql("SELECT min(drawdown) FROM equity").fetchall()
        eq = con.sql("SELECT ts_recv, pnl FROM equity ORDER BY ts_recv, seq").fetchnumpy()
    finally:
        con.close()
    assert want is not None and dd < 0
    assert sharpe(eq["ts_recv"], eq["pnl"]) == pytest.approx(want, rel=1e-9)
    assert max_drawdown(eq["pnl"]) == dd


def test_the_rows_pnl_and_its_split_are_the_views_over_every_book(session, tmp_path):
    # the summary's fills_pnl and symbol_pnl read only the books they can pick: the same answers as the
    # report's views over the written run's files, which read every book
    cfg = ReplayConfig(seed=3, laya_provider="cpu", risk=RiskLimits(daily_loss_stop_usd=1e9))
    res = run_replay(session, cfg, out_dir=tmp_path / "run")
    row = run_stats(res.run_dir)
    con = connect(res.run_dir)
    try:
        split = con.sql("SELECT spread_capture, inventory, fees, turnover_usdt, fills FROM pnl_attribution")
        (split,) = split.fetchall()
        pnl_sql = next(sql for name, _, sql in load_queries() if name == "pnl")
        rel = con.sql(pnl_sql)
        pnl = dict(zip(rel.columns, rel.fetchall()[0], strict=True))
    finally:
        con.close()
    assert split[-1] > 0
    assert (
        row["spread_capture_usdt"],
        row["inventory_usdt"],
        row["fees_paid_usdt"],
        row["turnover_usdt"],
        row["fills"],
    ) == split
    assert (row["pnl_usdt"], row["fees_usdt"], row["position"]) == (
        pnl["pnl_usdt"],
        pnl["fees_usdt"],
        float(pnl["position"]),
    )


@pytest.mark.parametrize("ties", [False, True])
def test_book_rows_met_give_an_asof_join_its_answers(ties):
    # books of two symbols out of time order, NaN mids; with ties, instants shared by several books
    rng = np.random.default_rng(5)
    n = 400
    ts = rng.integers(0, 120, n) * 10 if ties else rng.permutation(n * 3)[:n]
    books = pa.table(
        {
            "symbol": rng.choice(["AAA", "BBB"], n),
            "ts_recv": ts,
            "seq": rng.permutation(n),
            "bid_px_0": np.where(rng.random(n) < 0.05, np.nan, rng.normal(100, 1, n)),
            "ask_px_0": rng.normal(101, 1, n),
        }
    )
    fills = pa.table(
        {
            "symbol": rng.choice(["AAA", "BBB"], 90),
            "ts_recv": rng.integers(-5, 1300, 90),
            "seq": np.arange(90),
        }
    )
    asof = """SELECT f.seq, b.ts_recv, b.mid FROM f ASOF LEFT JOIN
        (SELECT symbol, ts_recv, (bid_px_0 + ask_px_0) / 2 AS mid FROM b) b
        ON f.symbol = b.symbol AND f.ts_recv >= b.ts_recv ORDER BY f.seq"""
    last = """SELECT symbol, (bid_px_0 + ask_px_0) / 2 FROM b WHERE isfinite(bid_px_0 + ask_px_0)
        QUALIFY row_number() OVER (PARTITION BY symbol ORDER BY ts_recv DESC, seq DESC) = 1 ORDER BY symbol"""
    met, at_end = book_rows_met(books, fills), book_rows_met(books, None)
    assert (met.num_rows == n) == ties and at_end.num_rows == 2
    con = duckdb.connect()
    try:
        con.register("f", fills)
        for query, narrow in ((asof, met), (last, at_end)):
            con.register("b", books)
            want = con.sql(query).fetchall()
            con.register("b", narrow)
            assert str(con.sql(query).fetchall()) == str(want)  # str: NaN == NaN
    finally:
        con.close()


def test_sweep_keeps_digests_and_rows_and_the_logs_asked_for(session, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID)
    out = tmp_path / "sweep" / "results.parquet"
    cmd = ["sweep", str(tmp_path / "grid.toml"), "--sessions", str(session), "--out", str(out), "--serial"]
    plot = tmp_path / "sweep.png"
    assert (
        main([*cmd, "--no-progress", "--keep-logs", "best:1", "--best", "pnl_usdt", "--plot", str(plot)]) == 0
    )
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 4 and not any(r["error"] for r in rows)
    # the cache: built by the first run, read by the others
    assert [r["market_cache"] for r in rows].count("reused") >= 3
    kept = [r for r in rows if r["log_kept"]]
    assert len(kept) == 1
    assert kept[0]["pnl_usdt"] == max(r["pnl_usdt"] for r in rows)
    runs = list((out.parent / "runs").iterdir())
    assert [p.name for p in runs] == [kept[0]["run_dir"].rsplit("/", 1)[1]]
    assert orjson.loads((runs[0] / "manifest.json").read_bytes())["digest"] == kept[0]["digest"]
    assert "best by pnl_usdt" in printed and "event logs kept for the 1 best" in printed

    # any row's replay_command replays it to the same digest (a row that wrote no log)
    row = next(r for r in rows if not r["log_kept"])
    argv = shlex.split(row["replay_command"])
    assert argv[:3] == ["dualhub", "replay", str(session.resolve())]
    argv[argv.index("--out") + 1] = str(tmp_path / "again")
    capsys.readouterr()
    assert main([*argv[1:], "--market-cache"]) == 0
    assert "market cache: reused" in capsys.readouterr().out  # the cache the sweep built
    again = orjson.loads((tmp_path / "again" / "manifest.json").read_bytes())
    assert again["digest"] == row["digest"]
    assert again["config_sha256"] == row["config_sha256"]


def test_best_table_ranks_parameter_sets_pooled_over_seeds():
    def row(seed, x, pnl, dd):
        return {"error": "", "param_hash": f"{seed}{x}", "p_seed": seed, "p_scale_kev": x, "pnl_usdt": pnl,
                "sharpe": pnl / 10, "max_drawdown_usdt": dd, "fills": 3}  # fmt: skip

    rows = [row(1, 0.5, 1.0, -5.0), row(2, 0.5, 3.0, -1.0), row(1, 2, 5.0, -9.0), row(2, 2, 1.0, -9.0)]
    cols, table = best_table(rows, "max_drawdown_usdt")
    assert cols[:4] == ["rank", "scale_kev", "runs", "max_drawdown_usdt"]
    assert [(t[0], t[1], t[2], t[3]) for t in table] == [(1, 0.5, 2, "-3"), (2, 2, 2, "-9")]
    _, table = best_table(rows, "pnl_usdt")
    assert [t[1] for t in table] == [2, 0.5]
    with pytest.raises(Exception, match="unknown metric"):
        best_table(rows, "nope")


def test_bad_keep_logs_and_metric_are_one_line(session, tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(GRID)
    cmd = ["sweep", str(tmp_path / "grid.toml"), "--sessions", str(session), "--serial", "--no-progress"]
    for extra, said in ((["--keep-logs", "best:0"], "best:K"), (["--best", "nope"], "unknown metric")):
        assert main([*cmd, "--out", str(tmp_path / "r.parquet"), *extra]) == 2
        assert said in capsys.readouterr().err
        assert not (tmp_path / "r.parquet").exists()


def test_the_plot_has_sharpe_and_drawdown_panels_and_still_plots_an_older_table(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from analysis import sweep_plot

    panels = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda n, m, **kw: panels.append(m) or real(n, m, **kw))

    def row(seed, x, **more):
        return {"error": "", "session": "s", "p_seed": seed, "p_scale_kev": x, "pnl_usdt": 1.0 * seed,
                "max_drawdown_usdt": -1.0 * x, "fills": 3, "loss_stop_at_frac": None, **more}  # fmt: skip

    rows = [row(s, x, sharpe=0.1 * s) for s in (1, 2) for x in (0.5, 2.0)]
    sweep_plot.plot_sweep(rows, tmp_path / "new.png")
    older = [{k: v for k, v in r.items() if k != "sharpe"} for r in rows]  # a table from before Sharpe
    sweep_plot.plot_sweep(older, tmp_path / "old.png")
    assert panels == [len(sweep_plot.METRICS), len(sweep_plot.METRICS) - 1]
    assert {"sharpe", "max_drawdown_usdt"} <= set(sweep_plot.METRICS)
