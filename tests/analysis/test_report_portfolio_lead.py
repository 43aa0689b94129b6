"""The report of a pair run leads with the portfolio (analysis/portfolio_lead.py), gives every loss
stop's hit/when/cost and the portfolio limits in its header, names the symbol in every table of several
instruments' rows, and shows the pairs hub's hedge ratio against the truth (analysis/hedge_fit.py).

All through the CLI: `dualhub simulate --symbols BTCUSDT,ETHUSDT` (3 minutes, seed 1: three regimes of
the pair's true beta), `dualhub replay --symbols ... --kev-hub pairs` once with a tight
`--portfolio ...,loss_stop_usd=20` (the stop is hit) and once without (unbound limits, no stop hit),
then `dualhub report`. Expected values are computed here from the event files (pyarrow, numpy) and
the session's manifest, not from the report's SQL.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from analysis import hedge_fit, portfolio
from analysis.report import connect, run_report
from dualhub.cli import main as dualhub

LEAD, FOLLOW = "BTCUSDT", "ETHUSDT"
STOP_USD = 20.0
# tables of the report (queries.sql) that count the one Kev queue of the portfolio, not an instrument's rows
PORTFOLIO_WIDE = {"kev", "kev_failures", "kev_answered_by", "kev_breaker"}


def cli(*args: str) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert dualhub(list(args)) == 0
    return buf.getvalue()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pair")
    cli(
        "simulate", "--symbols", f"{LEAD},{FOLLOW}", "--minutes", "3", "--seed", "1", "--out", str(root / "s")
    )
    common = ["--symbols", f"{LEAD},{FOLLOW}", "--kev-hub", "pairs"]
    cli("replay", str(root / "s"), *common, "--out", str(root / "stop"),
        "--portfolio", f"net_delta_usd=3000,gross_usd=9000,loss_stop_usd={STOP_USD:g}")  # fmt: skip
    cli("replay", str(root / "s"), *common, "--out", str(root / "free"))
    return root


@pytest.fixture(scope="module")
def report_stop(root: Path) -> str:
    return cli("report", str(root / "stop"))


@pytest.fixture(scope="module")
def report_free(root: Path) -> str:
    return cli("report", str(root / "free"))


def events(run: Path, stream: str):
    return pq.read_table(run / "events" / f"{stream}.parquet")


def books(root: Path) -> dict[str, np.ndarray]:
    t = pq.ParquetDataset(sorted((root / "s" / "books15").glob("*.parquet"))).read(
        columns=["symbol", "ts_recv", "seq", "bid_px_0", "ask_px_0"]
    )
    return {k: t[k].to_numpy(zero_copy_only=False) for k in t.column_names}


def table(text: str, title_start: str) -> tuple[list[str], list[list[str]]]:
    """The columns and rows of the console table whose title starts with ``title_start``."""
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(title_start))
    while not lines[i].startswith("┃"):
        i += 1
    cols = [c.strip() for c in lines[i].strip("┃").split("┃")]
    rows = []
    for ln in lines[i + 2 :]:
        if not ln.startswith("│"):
            break
        rows.append([c.strip() for c in ln.strip("│").split("│")])
    return cols, rows


def test_the_header_shows_the_portfolio_limits_from_the_command_line(report_stop, report_free) -> None:
    assert (
        "portfolio limits (USD, config risk.portfolio_*): net_delta_usd=3000, gross_usd=9000, "
        "loss_stop_usd=20; "
        "each leg's own: loss stop 100" in report_stop
    )
    assert "net_delta_usd=unbound, gross_usd=unbound, loss_stop_usd=unbound" in report_free
    # the header is before any table
    first_table = min(report_stop.index("┏"), report_stop.index("The portfolio, then each leg"))
    assert report_stop.index("portfolio limits") < first_table


def test_the_report_leads_with_the_portfolio_then_one_row_per_leg(root: Path, report_free: str) -> None:
    out = report_free
    lead_at = out.index("The portfolio, then each leg")
    assert lead_at < out.index("(tear sheet of this leg alone): Performance") < out.index("\nFills")
    assert "Sharpe from 1 s marks of that PnL, per sample and annualised x sqrt(samples in 365 days)" in out
    cols, rows = table(out, "The portfolio, then each leg")
    assert cols[:5] == ["scope", "pnl_usdt", "max_drawdown_usdt", "sharpe_1s", "sharpe_annualised"]
    assert [r[0] for r in rows] == ["portfolio", LEAD, FOLLOW]
    got = {r[0]: dict(zip(cols, r, strict=True)) for r in rows}

    # independently: the portfolio's PnL at the end from the fills (cash - fees + position x last mid)
    run = root / "free"
    fills, b = events(run, "fill"), books(root)
    pnl = {}
    for sym in (LEAD, FOLLOW):
        f = fills.filter(pc.equal(fills["symbol"], sym))
        sign = np.where(f["side"].to_numpy(zero_copy_only=False) == "buy", 1.0, -1.0)
        qty = f["qty"].to_numpy()
        notional = np.array([float(x) for x in f["notional"].to_pylist()])
        fee = np.array([float(x) for x in f["fee"].to_pylist()])
        sel = b["symbol"] == sym
        order = np.lexsort((b["seq"][sel], b["ts_recv"][sel]))
        mid = ((b["bid_px_0"][sel] + b["ask_px_0"][sel]) / 2)[order][-1]
        pnl[sym] = float(-(sign * notional).sum() - fee.sum() + (sign * qty).sum() * mid)
        assert float(got[sym]["pnl_usdt"]) == pytest.approx(pnl[sym], abs=2e-4)
        assert int(got[sym]["fills"]) == f.num_rows
    assert float(got["portfolio"]["pnl_usdt"]) == pytest.approx(sum(pnl.values()), abs=2e-4)
    assert int(got["portfolio"]["fills"]) == fills.num_rows

    # the time-weighted exposures and Sharpe, from the portfolio's equity series (numpy, not SQL)
    pf = portfolio.compute(run)
    e = pf.equity
    ts = e["ts_recv"].astype(np.int64)
    dur = np.diff(np.append(ts, ts[-1])).astype(np.float64)
    span = float(ts[-1] - ts[0])
    assert float(got["portfolio"]["gross_twa"]) == pytest.approx(
        (e["gross_usd"] * dur).sum() / span, abs=0.01
    )
    assert float(got["portfolio"]["abs_net_delta_twa"]) == pytest.approx(
        (np.abs(e["net_delta_usd"]) * dur).sum() / span, abs=0.01
    )
    assert float(got["portfolio"]["gross_max"]) == pytest.approx(e["gross_usd"].max(), abs=0.01)
    assert float(got["portfolio"]["abs_net_delta_max"]) == pytest.approx(
        np.abs(e["net_delta_usd"]).max(), abs=0.01
    )
    grid = np.arange(ts[0], ts[-1] + 1, 1_000_000_000)
    sampled = e["pnl"][np.searchsorted(ts, grid, side="right") - 1]
    ret = np.diff(sampled)
    assert float(got["portfolio"]["sharpe_1s"]) == pytest.approx(ret.mean() / ret.std(ddof=1), abs=1e-4)
    assert float(got["portfolio"]["sharpe_annualised"]) == pytest.approx(
        ret.mean() / ret.std(ddof=1) * np.sqrt(365 * 86400), rel=1e-3
    )
    peak = np.maximum.accumulate(e["pnl"])
    assert float(got["portfolio"]["max_drawdown_usdt"]) == pytest.approx((e["pnl"] - peak).min(), abs=2e-4)


def test_every_table_of_several_instruments_names_the_symbol(root: Path, report_free: str) -> None:
    for name in ("Fills", "Orders by lifecycle step", "Risk decisions by reason", "Laya labels",
                 "Portfolio commands by action", "Per-decision latency (ms)"):  # fmt: skip
        cols, rows = table(report_free, name)
        assert cols[0] == "symbol", name
        assert {r[0] for r in rows} == {LEAD, FOLLOW}, name
    cols, rows = table(report_free, "Fills")
    fills = events(root / "free", "fill")
    for sym in (LEAD, FOLLOW):
        n = sum(int(r[cols.index("n")]) for r in rows if r[0] == sym)
        assert n == pc.sum(pc.equal(fills["symbol"], sym)).as_py()
    for s in run_report(root / "free"):
        if s.name in PORTFOLIO_WIDE:  # no instrument's rows: titled as the portfolio's
            assert "symbol" not in s.columns
            assert s.title.endswith("all instruments (the portfolio's one Kev queue)")
        else:
            assert "symbol" in s.columns, s.name
    # every tear-sheet table is one leg's, and says which
    assert "BTCUSDT (tear sheet of this leg alone): Fee-adjusted markouts" in report_free


def test_the_portfolio_stop_says_it_was_hit_when_and_what_it_cost(root: Path, report_stop: str) -> None:
    run = root / "stop"
    risk = events(run, "risk")
    refused = risk.filter(pc.equal(risk["reason"], "portfolio_loss_stop"))
    assert refused.num_rows > 0
    stop_ns = pc.min(refused["ts_recv"]).as_py()
    b = books(root)
    t0 = int(b["ts_recv"].min())
    line = next(ln for ln in report_stop.splitlines() if ln.startswith("LOSS STOP hit: portfolio loss stop"))
    m = re.search(r"\(20 USD\) at t=([\d.]+) s \(its first refusal; (\d+) in all\): PnL (-?[\d.]+) then, "
                  r"(-?[\d.]+) at the end: cost ([\d.]+) USDT after the stop", line)  # fmt: skip
    assert m, line
    assert float(m[1]) == pytest.approx((stop_ns - t0) / 1e9, abs=0.05)
    assert int(m[2]) == refused.num_rows
    at_stop, end, cost = float(m[3]), float(m[4]), float(m[5])
    assert at_stop <= -STOP_USD + 0.5  # the stop bound because the summed PnL had reached the limit
    assert cost == pytest.approx(at_stop - end, abs=0.011)
    cols, rows = table(report_stop, "Loss stops")
    got = {r[0]: dict(zip(cols, r, strict=True)) for r in rows}
    assert [r[0] for r in rows] == ["portfolio", LEAD, FOLLOW]
    p = got["portfolio"]
    assert p["hit"] == "True" and float(p["limit_usd"]) == STOP_USD
    fills = events(run, "fill")
    after = fills.filter(pc.greater_equal(fills["ts_recv"], stop_ns))
    assert int(p["fills_after"]) == after.num_rows
    assert float(p["fees_after"]) == pytest.approx(sum(float(x) for x in after["fee"].to_pylist()), abs=1e-4)
    for sym in (LEAD, FOLLOW):  # each leg's own stop (100 USD) did not bind
        assert got[sym]["hit"] == "False" and got[sym]["at_s"] == ""
        assert f"{sym} loss stop (100 USD): not hit" in report_stop


def test_no_stop_hit_reads_so(report_free: str) -> None:
    assert "portfolio loss stop (unbound): not hit" in report_free
    assert "LOSS STOP" not in report_free and "loss stop: not hit" not in report_free  # no any-leg line


def test_the_hedge_ratio_is_shown_against_the_truth_per_regime(root: Path, report_free: str) -> None:
    manifest = json.loads((root / "s" / "manifest.json").read_text())
    (pair,) = manifest["simulator"]["pairs"]
    truths = [r["beta"] for r in pair["regimes"]]
    cols, rows = table(report_free, "Hedge ratio vs the simulator's true beta at the end of each regime")
    assert len(rows) == len(truths) == 3
    for r, truth in zip(rows, truths, strict=True):
        row = dict(zip(cols, r, strict=True))
        assert (row["leader"], row["follower"]) == (LEAD, FOLLOW)
        assert float(row["true_beta"]) == pytest.approx(truth, abs=1e-4)
        hub = float(row["hub_beta"])
        assert float(row["hub_error_pct"]) == pytest.approx((hub / truth - 1) * 100, abs=0.02)
        assert row["within_5pct"] == str(abs(hub / truth - 1) <= 0.05)
        assert float(row["hub_se"]) > 0
    assert "Hedge ratio vs a rolling estimate" in report_free


def test_the_refit_is_the_hubs_own_estimate(root: Path) -> None:
    """The fit re-run over the books is what the hub answered: every command's hedge ratio for the
    follower is the re-run estimate at its request (its context's time), rounded as the hub rounds."""
    run = root / "free"
    pf = portfolio.compute(run)
    f = pf.fits[(LEAD, FOLLOW)]
    con = connect(run)
    try:
        rows = con.sql(
            "SELECT c.hedge_ratio, r.ts_recv FROM command c JOIN kev_request r USING (request_id) "
            f"WHERE c.symbol = '{FOLLOW}' ORDER BY c.seq"
        ).fetchall()
    finally:
        con.close()
    assert len(rows) > 50
    for hedge, t in rows:
        assert round(f.at(t)[0], 6) == pytest.approx(hedge, abs=1.5e-6)


def test_recorded_data_compares_with_a_rolling_estimate_and_its_band(root: Path, tmp_path: Path) -> None:
    session = tmp_path / "recorded"
    shutil.copytree(root / "s", session)
    m = json.loads((session / "manifest.json").read_text())
    del m["simulator"]  # no truth: as a recorded session
    (session / "manifest.json").write_text(json.dumps(m))
    cli(
        "replay",
        str(session),
        "--symbols",
        f"{LEAD},{FOLLOW}",
        "--kev-hub",
        "pairs",
        "--out",
        str(tmp_path / "r"),
    )
    out = cli("report", str(tmp_path / "r"))
    assert "true beta at the end of each regime" not in out
    pf = portfolio.compute(tmp_path / "r")
    (sec,) = [s for s in portfolio.sections(pf) if s.name == "hedge_fit_rolling"]
    (row,) = sec.rows
    r = dict(zip(sec.columns, row, strict=True))
    f = pf.fits[(LEAD, FOLLOW)]
    b = f.rolling["beta_returns"][np.isfinite(f.rolling["beta_returns_se"])]
    s = f.rolling["beta_returns_se"][np.isfinite(f.rolling["beta_returns_se"])]
    assert r["rolling_beta"] == pytest.approx(b[-1], abs=1e-4)
    assert r["rolling_ci95_lo"] == pytest.approx(b[-1] - 1.96 * s[-1], abs=1e-4)
    assert r["hub_inside"] == (r["rolling_ci95_lo"] <= r["hub_beta"] <= r["rolling_ci95_hi"])
    assert 0.0 <= r["share_inside"] <= 1.0
    # the rolling se is the OLS slope's: recomputed here over the last window of 1 s returns
    con = connect(tmp_path / "r")
    try:
        x = con.sql("SELECT rx, ry FROM pair_samples WHERE rx IS NOT NULL ORDER BY t_ns").fetchnumpy()
    finally:
        con.close()
    rx, ry = x["rx"][-pf.beta_window :], x["ry"][-pf.beta_window :]
    slope = np.polyfit(rx, ry, 1)[0]
    resid = ry - ry.mean() - slope * (rx - rx.mean())
    se = np.sqrt((resid**2).sum() / (rx.size - 2) / ((rx - rx.mean()) ** 2).sum())
    assert b[-1] == pytest.approx(slope, rel=1e-6) and s[-1] == pytest.approx(se, rel=1e-6)
    assert hedge_fit.regime_section(pf.fits, pf.start_ns) is None


def test_the_html_tear_sheet_leads_with_the_portfolio(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    cli("report", str(root / "stop"), "--html", str(out))
    page = out.read_text()
    assert page.index("<h2>Portfolio</h2>") < page.index("<h2>Tear sheet: BTCUSDT alone</h2>")
    assert page.index("The portfolio, then each leg") < page.index("<h2>Tear sheet")
    assert "class='warn'>LOSS STOP hit: portfolio loss stop (20 USD)" in page
    assert "alt='hedge_fit'" in page and "true beta at the end of each regime" in page


@pytest.mark.slow
def test_chromium_renders_the_portfolio_first_with_the_hedge_fit_plot(root: Path, tmp_path: Path) -> None:
    from tests.analysis.test_report_browser import browse

    out = tmp_path / "r.html"
    cli("report", str(root / "stop"), "--html", str(out))
    dom = browse(out, tmp_path, "--dump-dom").stdout
    assert (
        dom.index("<h2>Portfolio</h2>")
        < dom.index("The portfolio, then each leg")
        < dom.index("<h2>Tear sheet")
    )
    imgs = re.findall(r"<img [^>]*>", dom)
    alts = [re.search(r'alt="([^"]+)"', i).group(1) for i in imgs]
    assert alts[:5] == ["portfolio_pnl", "portfolio_exposure", "hedge_ratio", "risk_rules", "hedge_fit"]
    assert all('src="data:image/png;base64,' in i for i in imgs)
    pf = portfolio.compute(root / "stop")
    assert len(re.findall(r"<table", dom)) >= len(portfolio.sections(pf)) + len(run_report(root / "stop"))


def test_each_legs_own_stop_says_it_was_hit_when_and_what_it_cost(root: Path) -> None:
    run = root / "legstop"
    cli("replay", str(root / "s"), "--symbols", f"{LEAD},{FOLLOW}", "--kev-hub", "pairs",
        "--params", '{"risk.daily_loss_stop_usd": 10}', "--out", str(run))  # fmt: skip
    out = cli("report", str(run))
    assert "each leg's own: loss stop 10," in out
    assert "portfolio loss stop (unbound): not hit" in out
    risk, fills = events(run, "risk"), events(run, "fill")
    t0 = int(books(root)["ts_recv"].min())
    cols, rows = table(out, "Loss stops")
    got = {r[0]: dict(zip(cols, r, strict=True)) for r in rows}
    for sym in (LEAD, FOLLOW):
        mine = risk.filter(pc.and_(pc.equal(risk["symbol"], sym), pc.equal(risk["reason"], "loss_stop")))
        assert mine.num_rows > 0, sym
        stop_ns = pc.min(mine["ts_recv"]).as_py()
        row = got[sym]
        assert row["hit"] == "True" and float(row["limit_usd"]) == 10.0
        assert float(row["at_s"]) == pytest.approx((stop_ns - t0) / 1e9, abs=1e-3)
        assert int(row["refusals"]) == mine.num_rows
        assert float(row["pnl_at_stop"]) <= -10.0 + 0.5
        assert float(row["after_stop"]) == pytest.approx(
            float(row["pnl_end"]) - float(row["pnl_at_stop"]), abs=2e-4
        )
        after = fills.filter(
            pc.and_(pc.equal(fills["symbol"], sym), pc.greater_equal(fills["ts_recv"], stop_ns))
        )
        assert int(row["fills_after"]) == after.num_rows
        assert re.search(rf"LOSS STOP hit: {sym} loss stop \(10 USD\) at t=[\d.]+ s", out)
    assert got["portfolio"]["hit"] == "False"
