"""The portfolio report (analysis/views.sql's portfolio views, analysis/portfolio.py) against a
two-symbol run built by hand over a real simulated session (`dualhub simulate --symbols
BTCUSDT,ETHUSDT`): fills, v2 Kev commands and risk refusals chosen here, their answers computed here
independently of the SQL (exact decimals for money, numpy for the time series and the betas). A
single-symbol run's report is unchanged, and shows no Portfolio section.

The run (seconds after the session's first book; prices are the session's mids then, on the tick):
  BTCUSDT  fills: buy 0.5 (t 10, maker), sell 0.2 (t 40, taker), buy 0.125 (t 130, maker)
  ETHUSDT  fills: sell 3 (t 12, maker), buy 1.25 (t 55, taker)
  commands (v2, one row per instrument): t 20, 60, 140: the leader's row hedge 1.0, ETHUSDT's 1.1/0.95/0.8
  risk: refusals max_position BTC (t 5), portfolio_net_delta ETH x2 (t 15, 16), portfolio_gross BTC
        (t 70), portfolio_loss_stop BTC and ETH (t 125), price_band ETH (t 150); accepted rows between
Session seed 1, 3 minutes: its pair's true beta changes at 126 s and 164 s (three regimes).
"""

from __future__ import annotations

import hashlib
import io
import math
from collections import Counter
from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from analysis import portfolio, tearsheet
from analysis.console import print_report
from analysis.html import write_html
from analysis.report import connect, run_report
from dualhub.cli import main as dualhub
from engine.eventlog import RUN_SCHEMA_VERSION, EventLog
from engine.events import STREAMS, Fill, LabelEvent, OrderEvent, PortfolioCommand, RiskDecision
from engine.store import sha256_file

S = 1_000_000_000
LEAD, FOLLOW = "BTCUSDT", "ETHUSDT"
TICK = {LEAD: Decimal("0.1"), FOLLOW: Decimal("0.01")}
FEE = {"maker": Decimal("0.0002"), "taker": Decimal("0.0006")}
FILLS = [  # (s, symbol, side, qty, liquidity)
    (10, LEAD, "buy", "0.5", "maker"),
    (12, FOLLOW, "sell", "3", "maker"),
    (40, LEAD, "sell", "0.2", "taker"),
    (55, FOLLOW, "buy", "1.25", "taker"),
    (130, LEAD, "buy", "0.125", "maker"),
]
COMMANDS = [(20, 1.1), (60, 0.95), (140, 0.8)]  # (s, ETHUSDT's hedge ratio); BTCUSDT's row 1.0
REFUSALS = [  # (s, symbol, reason)
    (5, LEAD, "max_position"),
    (15, FOLLOW, "portfolio_net_delta"),
    (16, FOLLOW, "portfolio_net_delta"),
    (70, LEAD, "portfolio_gross"),
    (125, LEAD, "portfolio_loss_stop"),
    (125, FOLLOW, "portfolio_loss_stop"),
    (150, FOLLOW, "price_band"),
]
ACCEPTED = [(9, LEAD), (11, FOLLOW), (54, FOLLOW)]


def simulate(root: Path) -> Path:
    out = root / "session"
    assert dualhub(["simulate", "--symbols", f"{LEAD},{FOLLOW}", "--minutes", "3", "--seed", "1",
                    "--out", str(out)]) == 0  # fmt: skip
    return out


def session_books(session: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per symbol, the session's books in (ts_recv, seq) order: ts_recv, seq, mid (pyarrow, not SQL)."""
    files = sorted((session / "books15").glob("*.parquet"))
    t = pq.ParquetDataset(files).read(columns=["symbol", "ts_recv", "seq", "bid_px_0", "ask_px_0"])
    out = {}
    for sym in (LEAD, FOLLOW):
        s = t.filter(pc.equal(t["symbol"], sym))
        ts, seq = s["ts_recv"].to_numpy(), s["seq"].to_numpy()
        order = np.lexsort((seq, ts))
        mid = (s["bid_px_0"].to_numpy() + s["ask_px_0"].to_numpy()) / 2
        out[sym] = {"ts_recv": ts[order], "seq": seq[order], "mid": mid[order]}
    return out


def mid_at(books: dict[str, np.ndarray], t_ns: int) -> float:
    return float(books["mid"][np.searchsorted(books["ts_recv"], t_ns, side="right") - 1])


def on_tick(px: float, tick: Decimal) -> Decimal:
    return (Decimal(repr(px)) / tick).to_integral_value() * tick


def write_run(root: Path, session: Path, *, symbols: tuple[str, ...] = (LEAD, FOLLOW)) -> Path:
    """A finished run directory over ``session`` with the hand-chosen events of ``symbols`` (the
    project's EventLog writes the event files and their digest)."""
    books = session_books(session)
    t0 = int(min(b["ts_recv"][0] for b in books.values()))
    at = lambda s: t0 + int(s * S)  # noqa: E731
    run = root / "run"
    (run / "events").mkdir(parents=True)
    log = EventLog(run / "events")
    for sym in symbols:  # a few labels per instrument, on its own books
        b = books[sym]
        for i in (3, 50, 400):
            ts = int(b["ts_recv"][i])
            log.emit(LabelEvent, ts_event=ts, ts_recv=ts + 1000, symbol=sym, book_seq=int(b["seq"][i]),
                     book_ts_recv=ts, label="HOLD", p_hold=0.7, p_lean_buy=0.1, p_lean_sell=0.1,
                     p_emergency=0.1)  # fmt: skip
    for s, sym, reason in [*REFUSALS, *((s, sym, "") for s, sym in ACCEPTED)]:
        if sym in symbols:
            log.emit(RiskDecision, ts_event=at(s), ts_recv=at(s), client_oid=f"dh-r{s}-{sym}", symbol=sym,
                     intent="new", side="buy", order_type="limit", px=1.0, qty=1.0, source="quote",
                     advice_age_ns=-1, accepted=not reason, reason=reason)  # fmt: skip
    for s, hedge in COMMANDS:
        for sym, h in ((LEAD, 1.0), (FOLLOW, hedge)):
            if sym in symbols:
                log.emit(PortfolioCommand, ts_event=at(s), ts_recv=at(s), command_id=s, request_id=s,
                         symbol=sym, action="REBALANCE", target_position=0.0, hedge_ratio=h,
                         max_slippage_bps=5.0, reason="pairs", valid_until=at(s + 5))  # fmt: skip
    for s, sym, side, qty, liq in FILLS:
        if sym not in symbols:
            continue
        px = on_tick(mid_at(books[sym], at(s)), TICK[sym])
        notional = px * Decimal(qty)
        oid = f"dh-{s}"
        log.emit(OrderEvent, ts_event=at(s) - 1, ts_recv=at(s) - 1, client_oid=oid, symbol=sym, kind="new",
                 side=side, order_type="limit", px=float(px), qty=float(qty), reason="")  # fmt: skip
        log.emit(Fill, ts_event=at(s), ts_recv=at(s), client_oid=oid, symbol=sym, side=side, px=float(px),
                 qty=float(qty), liquidity=liq, notional=notional, fee=notional * FEE[liq],
                 position_after=0.0)  # fmt: skip
    files = log.write()
    q = run / "events" / "input_quarantine.parquet"
    pq.write_table(STREAMS["input_quarantine"].schema.empty_table(), q)
    files["events/input_quarantine.parquet"] = {"rows": 0, "sha256": sha256_file(q)}
    smf = orjson.loads((session / "manifest.json").read_bytes())
    config = {"symbol": symbols[0], "risk": {"daily_loss_stop_usd": 100.0}}
    if len(symbols) > 1:
        config["symbols"] = list(symbols)
    manifest = {
        "run_schema_version": RUN_SCHEMA_VERSION,
        "digest": log.digest,
        "config": config,
        "files": files,
        "session": {"path": str(session), "files": smf["files"]},
    }
    (run / "manifest.json").write_bytes(orjson.dumps(manifest))
    return run


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate(tmp_path_factory.mktemp("pf_session"))


@pytest.fixture(scope="module")
def run(session: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("pf_run"), session)


@pytest.fixture(scope="module")
def books(session: Path) -> dict[str, dict[str, np.ndarray]]:
    return session_books(session)


@pytest.fixture()
def con(run: Path):
    c = connect(run)
    yield c
    c.close()


def _rows(con, sql: str) -> list[dict]:
    rel = con.sql(sql)
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


def start_ns(books) -> int:
    return int(min(b["ts_recv"][0] for b in books.values()))


def hand_fills(books) -> list[tuple[int, str, str, Decimal, Decimal, Decimal]]:
    """(ts_recv, symbol, side, qty, notional, fee) of the run's fills, as write_run chose them."""
    t0 = start_ns(books)
    out = []
    for s, sym, side, qty, liq in FILLS:
        at = t0 + int(s * S)
        notional = on_tick(mid_at(books[sym], at), TICK[sym]) * Decimal(qty)
        out.append((at, sym, side, Decimal(qty), notional, notional * FEE[liq]))
    return out


def test_the_run_is_a_portfolio_of_both_symbols_and_their_pair(con) -> None:
    assert sorted(r["symbol"] for r in _rows(con, "FROM run_symbols")) == [LEAD, FOLLOW]
    assert _rows(con, "FROM pairs") == [{"leader": LEAD, "follower": FOLLOW}]  # the session's simulated pair


def test_pnl_per_instrument_and_in_total_in_exact_decimals(con, books) -> None:
    want = {}
    for sym in (LEAD, FOLLOW):
        mine = [f for f in hand_fills(books) if f[1] == sym]
        position = sum((q if side == "buy" else -q for _, _, side, q, _, _ in mine), Decimal(0))
        cash = sum((n if side == "sell" else -n for _, _, side, _, n, _ in mine), Decimal(0))
        fees = sum((f for *_, f in mine), Decimal(0))
        b = books[sym]
        mark = b["mid"][np.isfinite(b["mid"])][-1]  # the symbol's own last book, not the session's last
        want[sym] = (
            len(mine),
            position,
            cash,
            fees,
            cash - fees + position * Decimal(repr(float(mark))),
            mark,
        )
    got = {r["symbol"]: r for r in _rows(con, "FROM portfolio_pnl")}
    assert set(got) == {LEAD, FOLLOW, "TOTAL"}
    for sym, (n, position, cash, fees, pnl, mark) in want.items():
        r = got[sym]
        assert (r["fills"], r["position"], r["trading_cash"], r["fees"], r["pnl"]) == (
            n,
            position,
            cash,
            fees,
            pnl,
        )
        assert r["mark_px"] == mark and r["delta_usd"] == float(position) * mark
    total = got["TOTAL"]
    assert total["pnl"] == want[LEAD][4] + want[FOLLOW][4] and total["fills"] == len(FILLS)
    assert total["fees"] == want[LEAD][3] + want[FOLLOW][3]
    assert total["delta_usd"] == pytest.approx(got[LEAD]["delta_usd"] + got[FOLLOW]["delta_usd"], abs=1e-9)
    assert total["gross_usd"] == pytest.approx(abs(got[LEAD]["delta_usd"]) + abs(got[FOLLOW]["delta_usd"]))
    assert total["position"] is None and total["mark_px"] is None  # sizes of two instruments do not add


def test_net_delta_gross_and_pnl_at_every_book_of_either_instrument(con, books) -> None:
    fills = hand_fills(books)
    times = np.unique(np.concatenate([b["ts_recv"][np.isfinite(b["mid"])] for b in books.values()]))
    pnl, net, gross = np.zeros(times.size), np.zeros(times.size), np.zeros(times.size)
    for sym, b in books.items():
        ok = np.isfinite(b["mid"])
        ts, mid = b["ts_recv"][ok], b["mid"][ok]
        for k, t in enumerate(times):
            i = np.searchsorted(ts, t, side="right") - 1  # the symbol's last book at or before t
            if i < 0:
                continue  # no book of it yet: it counts 0
            mine = [f for f in fills if f[1] == sym and f[0] <= ts[i]]  # the fills that book sees
            pos = sum((q if side == "buy" else -q for _, _, side, q, _, _ in mine), Decimal(0))
            cash = sum((n - f if side == "sell" else -n - f for _, _, side, _, n, f in mine), Decimal(0))
            pnl[k] += float(cash) + float(pos) * mid[i]
            net[k] += float(pos) * mid[i]
            gross[k] += abs(float(pos) * mid[i])
    got = con.execute(
        "SELECT ts_recv, pnl, net_delta_usd, gross_usd FROM portfolio_equity ORDER BY ts_recv"
    ).fetchnumpy()
    assert got["ts_recv"].tolist() == times.tolist()
    np.testing.assert_allclose(got["net_delta_usd"], net, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(got["gross_usd"], gross, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(got["pnl"], pnl, rtol=1e-9, atol=1e-8)
    assert (net != gross).any() and gross.max() > 0  # the legs hedge each other somewhere: not one sign


def test_refusals_by_rule_instrument_and_time_bucket(con, books) -> None:
    t0 = start_ns(books)
    con.execute(f"SET VARIABLE bucket_ns = {60 * S}")
    want = Counter((int(s * S) // (60 * S) * 60.0, reason, sym) for s, sym, reason in REFUSALS)
    got = {
        (r["bucket_s"], r["reason"], r["symbol"]): r["n"] for r in _rows(con, "FROM risk_refusals_bucketed")
    }
    assert got == dict(want)
    stats = {(r["reason"], r["symbol"]): r for r in _rows(con, "FROM risk_rule_stats")}
    assert {k: v["refusals"] for k, v in stats.items()} == dict(Counter((r, s) for _, s, r in REFUSALS))
    assert {k: v["level"] for k, v in stats.items() if k[0].startswith("portfolio_")} == {
        k: "portfolio" for k in stats if k[0].startswith("portfolio_")
    }
    assert stats["max_position", LEAD]["level"] == "instrument"
    nd = stats["portfolio_net_delta", FOLLOW]
    assert (nd["first_s"], nd["last_s"], nd["share"]) == (15.0, 16.0, 2 / len(REFUSALS))
    assert t0 == con.sql("SELECT start_ns FROM portfolio_span").fetchall()[0][0]


def _samples(books, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pair's sample instants and log mids (the last book at or before), computed here."""
    lead, fol = books[LEAD], books[FOLLOW]
    t = np.arange(
        max(lead["ts_recv"][0], fol["ts_recv"][0]), min(lead["ts_recv"][-1], fol["ts_recv"][-1]) + 1, step
    )
    lx = np.log(lead["mid"][np.searchsorted(lead["ts_recv"], t, side="right") - 1])
    ly = np.log(fol["mid"][np.searchsorted(fol["ts_recv"], t, side="right") - 1])
    return t, lx, ly


def _ols(y: np.ndarray, x: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))


def test_rolling_beta_is_the_ols_slope_over_the_window(con, books) -> None:
    con.execute(f"SET VARIABLE beta_sample_ns = {2 * S}")
    con.execute("SET VARIABLE beta_window = 20")
    t, lx, ly = _samples(books, 2 * S)
    rx, ry = np.r_[np.nan, np.diff(lx)], np.r_[np.nan, np.diff(ly)]
    got = con.execute("SELECT t_ns, beta_returns, beta_levels FROM pair_beta ORDER BY t_ns").fetchnumpy()
    assert got["t_ns"].tolist() == t.tolist()
    for k in range(2, t.size):
        lo = max(0, k - 19)
        assert got["beta_returns"][k] == pytest.approx(_ols(ry[lo : k + 1], rx[lo : k + 1]), rel=1e-9)
        assert got["beta_levels"][k] == pytest.approx(_ols(ly[lo : k + 1], lx[lo : k + 1]), rel=1e-9)


def test_kev_hedge_ratio_beside_the_realised_and_the_true_beta(con, books, session) -> None:
    t0 = start_ns(books)
    truth = orjson.loads((session / "manifest.json").read_bytes())["simulator"]["pairs"][0]
    regimes = sorted(truth["regimes"], key=lambda r: r["start_ms"])
    assert len(regimes) == 3, "seed 1, 3 minutes: two regime changes inside the session"

    def true_beta(t_ns: int) -> float:
        return [r["beta"] for r in regimes if r["start_ms"] * 1_000_000 <= t_ns][-1]

    rows = _rows(con, "FROM hedge_ratio")
    assert [(r["ts_recv"], r["follower"], r["hedge_ratio"]) for r in rows] == [
        (t0 + s * S, FOLLOW, h) for s, h in COMMANDS
    ]  # the follower's rows only: the leader's 1.0 is no hedge ratio
    beta = con.execute("SELECT t_ns, beta_returns, beta_levels FROM pair_beta ORDER BY t_ns").fetchnumpy()
    for r in rows:
        assert r["true_beta"] == true_beta(r["ts_recv"])
        i = np.searchsorted(beta["t_ns"], r["ts_recv"], side="right") - 1
        assert (r["beta_returns"], r["beta_levels"]) == (beta["beta_returns"][i], beta["beta_levels"][i])
    assert {r["true_beta"] for r in rows} == {regimes[0]["beta"], regimes[1]["beta"]}

    reg = _rows(con, "FROM hedge_ratio_regimes")
    assert [r["true_beta"] for r in reg] == [r["beta"] for r in regimes]
    assert [r["commands"] for r in reg] == [2, 1, 0]
    assert reg[0]["hedge_mean"] == pytest.approx((1.1 + 0.95) / 2) and reg[0]["hedge_last"] == 0.95
    assert reg[1]["hedge_last"] == 0.8 and reg[2]["hedge_mean"] is None
    t, lx, ly = _samples(books, S)
    first = (t >= regimes[1]["start_ms"] * 1_000_000) & (t < regimes[2]["start_ms"] * 1_000_000)
    rx, ry = np.r_[np.nan, np.diff(lx)], np.r_[np.nan, np.diff(ly)]
    assert reg[1]["samples"] == int(first.sum())
    assert reg[1]["beta_returns"] == pytest.approx(_ols(ry[first], rx[first]), rel=1e-9)
    assert reg[1]["beta_levels"] == pytest.approx(_ols(ly[first], lx[first]), rel=1e-9)


def test_the_report_has_a_portfolio_section(run) -> None:
    pf = portfolio.compute(run)
    assert pf is not None and pf.symbols == [LEAD, FOLLOW]
    # the portfolio and each leg and the loss stops lead (tests/analysis/test_report_portfolio_lead.py),
    # the hub's estimate against the truth and a rolling estimate close
    assert [s.name for s in portfolio.sections(pf)] == [
        "portfolio_lead", "loss_stops", "portfolio_pnl", "portfolio_exposure", "hedge_ratio", "risk_rules",
        "hedge_fit_regimes", "hedge_fit_rolling",
    ]  # fmt: skip
    total = next(r for r in pf.tables[0].rows if r[0] == "TOTAL")
    assert total[1] == len(FILLS)
    buf = io.StringIO()
    from rich.console import Console

    print_report(run, console=Console(file=buf, width=120, color_system=None))
    out = buf.getvalue()
    assert "portfolio: 2 instruments (BTCUSDT, ETHUSDT)" in out
    for s in pf.tables:
        assert s.title in out
    figs = portfolio.figures(pf)
    import matplotlib.pyplot as plt

    for f in figs.values():
        plt.close(f)
    assert sorted(figs) == ["hedge_fit", "hedge_ratio", "portfolio_exposure", "portfolio_pnl", "risk_rules"]
    html = write_html(run, run.parent / "report.html").read_text()
    assert "<h2>Portfolio</h2>" in html
    for name in figs:
        assert f"<img alt='{name}' src='data:image/png;base64," in html


def test_bucket_is_a_nice_step_giving_at_most_max_buckets() -> None:
    assert portfolio.bucket_ns_for(180 * S) == 5 * S  # 36 buckets of 5 s; 2 s would give 90
    assert portfolio.bucket_ns_for(3600 * S) == 60 * S
    assert portfolio.bucket_ns_for(0) == S


# A single-symbol run: the report it printed before the Portfolio section existed. SINGLE_SHA256 hashes
# the tear sheet's and the report's tables (names, titles, columns, rows; floats to 9 digits) of
# tests/analysis/test_tearsheet.py's hand-built run, as the report gave them at the commit before
# this file, then with two titles of issue 58 (annualised ratios of a run shorter than a day flagged, the
# per-stage latency table saying what its counts count), then that table's title naming the send-to-ack
# stage order_sent_to_ack (its only change: the same hash with the old label map and query).
SINGLE_SHA256 = "ea989de389d84791d36f6d15712bf0cd9a82408f1b93765bbd2fba1484dad2a5"


def _tables_sha256(sections) -> str:
    def norm(v):
        return f"{v:.9g}" if isinstance(v, float) else repr(v)

    text = "\n".join(
        f"{s.name}|{s.title}|{s.columns}|" + ";".join(",".join(norm(v) for v in r) for r in s.rows)
        for s in sections
    )
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_single_symbol_report_is_unchanged(tmp_path: Path) -> None:
    from tests.analysis.test_tearsheet import CAL
    from tests.analysis.test_tearsheet import write_run as single_run

    run = single_run(tmp_path)
    assert portfolio.compute(run) is None
    ts = tearsheet.compute(run, labels=CAL)
    assert _tables_sha256([*tearsheet.sections(ts), *run_report(run)]) == SINGLE_SHA256
    buf = io.StringIO()
    from rich.console import Console

    print_report(run, console=Console(file=buf, width=120, color_system=None))
    assert "portfolio" not in buf.getvalue().lower().replace("portfolio commands", "")
    assert "Portfolio</h2>" not in write_html(run, tmp_path / "r.html").read_text()


def test_one_symbol_traded_on_a_two_symbol_session_is_no_portfolio(session, books, tmp_path: Path) -> None:
    run = write_run(tmp_path, session, symbols=(LEAD,))
    assert portfolio.compute(run) is None
    pnl = next(s for s in run_report(run) if s.name == "pnl")
    (row,) = pnl.rows
    mine = [f for f in hand_fills(books) if f[1] == LEAD]
    position = sum((q if side == "buy" else -q for _, _, side, q, _, _ in mine), Decimal(0))
    cash = sum((n - f if side == "sell" else -n - f for _, _, side, _, n, f in mine), Decimal(0))
    mark = books[LEAD]["mid"][-1]  # BTCUSDT's last book, not the session's last (which may be ETHUSDT's)
    assert row[1] == mark and row[0] == float(position)
    want = (cash + position * Decimal(repr(float(mark)))).quantize(Decimal("0.0001"))
    assert row[4] == want
    assert not math.isclose(mark, books[FOLLOW]["mid"][-1])


@pytest.mark.slow
def test_the_portfolio_notebook_runs_on_the_two_symbol_run(run, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.notebooks.test_notebooks import REPO, _execute

    monkeypatch.setenv("DUALHUB_RUN", str(run))
    monkeypatch.delenv("DUALHUB_SESSION", raising=False)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = _execute(REPO / "notebooks" / "12_portfolio.ipynb", REPO)
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outs)  # rich: data
    assert "portfolio: 2 instruments (BTCUSDT, ETHUSDT)" in text and "Which risk rule bound" in text
    assert "The portfolio, then each leg" in text and "Hedge ratio vs the simulator's true beta" in text
    assert "ETHUSDT on BTCUSDT: " in text and "half-life 60 s; " in text  # the estimate-vs-truth verdict
    images = [o for o in outs if "image/png" in o.get("data", {})]
    assert len(images) == 5  # PnL, exposure, hedge ratio, risk rules, the hub's fit vs the truth
