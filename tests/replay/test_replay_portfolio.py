"""Replay of several instruments as one portfolio (replay/portfolio.py): a simulated two-symbol session
and the 8-symbol Bitget v1 capture, one engine, one clock, one event log."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.compute as pc
import pytest

from engine.errors import DualhubError
from engine.risk import RiskLimits
from engine.strategy import QuoteConfig
from recorder.importers.bitget_v1 import import_bitget_v1
from replay.config import ReplayConfig, session_contract
from replay.driver import run_replay
from tests.helpers import REPO
from venue.simulator import simulate_session

REAL = REPO.parent / "shared" / "data" / "real"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair") / "session"
    simulate_session(out, symbols=("BTCUSDT", "ETHUSDT"), minutes=1.5, seed=11)
    return out


def _q(run: Path, sql: str) -> list[tuple]:
    return duckdb.sql(sql.replace("EV/", f"{run}/events/")).fetchall()


def test_a_portfolio_of_one_instrument_replays_to_the_single_instrument_run(pair, tmp_path):
    eth = session_contract(json.loads((pair / "manifest.json").read_text()), "ETHUSDT")
    q = QuoteConfig(quote_qty=0.01)  # whole lots of ETHUSDT's 0.01
    single = run_replay(
        pair, ReplayConfig(symbol="ETHUSDT", contract=eth, quotes=q), out_dir=tmp_path / "a", kernel=False
    )
    one = run_replay(pair, ReplayConfig(symbols=("ETHUSDT",), quotes=q), out_dir=tmp_path / "b")
    assert one.path.startswith("kernel (a portfolio of 1, books streamed")
    assert one.counts["fill"] > 0 and one.counts["command"] > 0
    assert one.digest == single.digest
    per_event = run_replay(
        pair, ReplayConfig(symbols=("ETHUSDT",), quotes=q), out_dir=tmp_path / "c", kernel=False
    )
    assert per_event.path.startswith("python (a portfolio of 1")
    assert per_event.digest == single.digest


# Configurations the compiled portfolio loop runs: each must give the per-event engine's events.
COMPILED = {
    "default": {},
    "drawn latencies": dict(
        latency_order_entry="lognormal:p5=2ms,p95=8ms",
        latency_order_response="lognormal:p5=1ms,p95=9ms",
        latency_cancel="lognormal:p5=1ms,p95=3ms",
        latency_laya="lognormal:p5=100us,p95=400us",
    ),
    "portfolio limits, Kev in flight": dict(
        risk=RiskLimits(portfolio_max_net_delta_usd=500.0, portfolio_loss_stop_usd=20.0),
        kev_max_in_flight=3,
        kev_queue_policy="fifo",
    ),
    "touch fills, Kev timeouts": dict(
        seed=5, fill_model="touch", kev_lag_p5_ms=1.0, kev_lag_p95_ms=3000.0, kev_timeout_ms=300
    ),
    "Kev as the hub": dict(kev_hub="pairs"),
    "labels per tick": dict(laya_mode="tick", latency_laya="lognormal:p5=100us,p95=400us"),
    "the hub, its replies late or timed out": dict(
        kev_hub="pairs",
        seed=7,
        kev_lag_p5_ms=1.0,
        kev_lag_p95_ms=3000.0,
        kev_timeout_ms=300,
        kev_max_in_flight=2,
    ),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_the_compiled_loop_replays_a_portfolio_as_the_engine_driven_per_event(pair, tmp_path, name):
    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), **COMPILED[name])
    k = run_replay(pair, cfg, out_dir=tmp_path / "k")
    p = run_replay(pair, cfg, out_dir=tmp_path / "p", kernel=False)
    # labels (batch or per tick) stream the books a block at a time
    assert k.path.startswith("kernel (a portfolio of 2, books streamed")
    assert p.path.startswith("python (a portfolio of 2")
    assert k.counts == p.counts
    assert k.digest == p.digest
    run = k.run_dir
    # both instruments traded, and an EMERGENCY label of one pulled the other's quotes too
    assert _q(run, "select count(distinct symbol) from 'EV/fill.parquet'") == [(2,)]
    assert _q(run, "select count(*) from 'EV/label.parquet' where label = 'EMERGENCY'")[0][0] > 0
    if name == "portfolio limits, Kev in flight":
        bound = _q(run, "select distinct reason from 'EV/risk.parquet' where not accepted")
        assert any("portfolio" in r for (r,) in bound), bound
    if "hub" in name:  # each command of the hub set both instruments, under one id
        per_cmd = _q(run, "select count(distinct symbol) from 'EV/command.parquet' group by command_id")
        assert per_cmd and set(per_cmd) == {(2,)}
        assert _q(run, "select count(*) from 'EV/kev_response.parquet' where ok")[0][0] == len(per_cmd)


@pytest.mark.parametrize("hub", ["", "pairs"])
def test_stopping_and_resuming_the_portfolio_loop_changes_nothing(pair, tmp_path, monkeypatch, hub):
    """Tiny buffers, tables and walk chunks: the loop stops for room, growth and Kev lags all the time,
    and tables of either instrument grow mid-run (the loop must pick up the new arrays). With Kev as
    the hub, the other instruments take each command between two steps of the loop, stops and all."""
    from engine import kernel as K
    from replay import fast_path

    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), seed=3, kev_max_in_flight=2, kev_hub=hub)
    whole = run_replay(pair, cfg, out_dir=tmp_path / "whole")
    monkeypatch.setattr(fast_path, "OUT_CAP", K.MARGIN + 40)
    monkeypatch.setattr(fast_path, "WALK_CHUNK", 700)
    monkeypatch.setattr(fast_path, "INITIAL_ROWS", K.MARGIN + 8)
    monkeypatch.setattr(fast_path, "LAG_BATCH", 3)
    handle, grown = fast_path.KernelRun.handle, []

    def handle_and_grow(self, status):  # at any stop, not only a stop for growth
        if len(grown) < 4 and int(self.S[K.S_OID]) > 150 * (len(grown) + 1):
            self._grow_orders()
            self._grow_work()
            grown.append(self.symbol)
        return handle(self, status)

    monkeypatch.setattr(fast_path.KernelRun, "handle", handle_and_grow)
    small = run_replay(pair, cfg, out_dir=tmp_path / "small")
    assert len(grown) == 4
    assert small.path.startswith("kernel (a portfolio of 2, books streamed")
    assert small.digest == whole.digest


def test_streamed_books_of_interleaved_symbols_replay_as_whole_tables(pair, tmp_path, monkeypatch):
    """Each symbol's levels picked out of row groups that hold both, a few rows at a time, in blocks
    smaller than a group and walk chunks that straddle blocks: the same run as whole tables."""
    import pyarrow.parquet as pq

    import engine.store as store
    import replay.book_source as book_source
    from replay import fast_path
    from replay.labels import _load_laya
    from replay.portfolio import run_portfolio

    monkeypatch.setattr(store, "ROW_GROUP_ROWS", 97)
    s = store.SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT", "ETHUSDT"])
    src = store.open_session(pair)
    for stream in ("books15", "trade"):
        s.add_table(stream, src.read_table(stream))
    s.close()
    parts = sorted((tmp_path / "s" / "books15").glob("*.parquet"))
    groups = [pq.ParquetFile(p).read_row_group(g, columns=["symbol"]) for p in parts for g in range(3)]
    assert all(len(set(g.column(0).to_pylist())) == 2 for g in groups)  # both symbols in each group
    monkeypatch.setattr(book_source, "BLOCK", 64)  # labels batched by 64 rows: still bit-identical
    monkeypatch.setattr(fast_path, "WALK_CHUNK", 150)
    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), seed=6)
    laya = _load_laya(cfg)
    reads = []
    real_read = book_source.read_group
    monkeypatch.setattr(book_source, "read_group", lambda *a: reads.append(a[3]) or real_read(*a))
    waiting = []  # rows pushed to the symbols and not yet taken by their blocks, after each ask
    real_rows = book_source.GroupCache.rows

    def rows(self, *a):
        got = real_rows(self, *a)
        waiting.append(sum(len(r) for by in self._rows.values() for r in by.values()))
        return got

    monkeypatch.setattr(book_source.GroupCache, "rows", rows)
    args = dict(out_dir=None, overwrite=False, progress=False)
    streamed = run_portfolio(tmp_path / "s", cfg, laya, **args | {"out_dir": tmp_path / "a"})
    level_reads = [r for r in reads if r != ["symbol"]]
    assert {len(r) for r in level_reads} == {15}  # a quarter of the level columns at a time
    level_reads = sum(1 for r in level_reads if r[0] == "bid_px_0")
    whole = run_portfolio(tmp_path / "s", cfg, laya, **args | {"out_dir": tmp_path / "b"}, stream_books=False)
    assert whole.path == "kernel (a portfolio of 2)"
    syms = store.open_session(tmp_path / "s").read_table("books15").column("symbol").to_pylist()
    n = [syms.count("BTCUSDT"), syms.count("ETHUSDT")]
    block = 16  # a portfolio of two: a quarter of the blocks' rows
    head, blocks = streamed.path.rsplit(", ", 1)
    assert head == "kernel (a portfolio of 2, books streamed"
    # every block read, some again (walk chunks of 150 entries reach back past the two blocks kept)
    assert int(blocks.split()[0]) >= sum(-(-k // block) for k in n)
    assert streamed.digest == whole.digest and streamed.counts["fill"] > 0
    # the groups are shared: read about once each for the two symbols, not once per symbol
    n_groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in parts)
    assert n_groups <= level_reads < 1.5 * n_groups
    # what waits for a symbol is rows of the groups being walked, not every group read so far
    assert 0 < max(waiting) <= 3 * 97, max(waiting)


def test_a_bad_book_row_in_a_streamed_portfolio_reruns_on_whole_tables_and_is_reported(pair, tmp_path):
    import pyarrow as pa

    import engine.store as store

    src = store.open_session(pair)
    books = src.read_table("books15")
    eth = np.flatnonzero(pc.equal(books.column("symbol"), "ETHUSDT").to_numpy(zero_copy_only=False))
    sz = books.column("bid_sz_0").to_numpy(zero_copy_only=False).copy()
    sz[eth[len(eth) // 2]] = -1.0  # a negative size, well into the session
    books = books.set_column(books.schema.get_field_index("bid_sz_0"), "bid_sz_0", pa.array(sz))
    w = store.SessionWriter(tmp_path / "s", source="test", symbols=["BTCUSDT", "ETHUSDT"])
    w.add_table("books15", books)
    w.add_table("trade", src.read_table("trade"))
    w.close()
    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), seed=6)
    k = run_replay(tmp_path / "s", cfg, out_dir=tmp_path / "k")
    assert k.path == "kernel (a portfolio of 2)"  # streamed first, then whole tables
    assert k.quarantine == {"books15": {"negative_size": 1}}, k.quarantine
    p = run_replay(tmp_path / "s", cfg, out_dir=tmp_path / "p", kernel=False)
    assert p.digest == k.digest and p.quarantine == k.quarantine


def _sorted_walk(tapes, dues):
    """The portfolio walk by its definition, sorted whole: (ts, priority, instrument, place in the tape's
    order), then labels at their due times, ties among them in the order their books reached the
    engine (across the instruments)."""
    from engine.core import PRIO_LABEL

    parts = [t.order(None) for t in tapes]
    ts, prio, kind, row = (np.concatenate([p[k] for p in parts]) for k in range(4))
    inst = np.concatenate([np.full(len(p[0]), j, dtype=np.int64) for j, p in enumerate(parts)])
    place = np.concatenate([np.arange(len(p[0])) for p in parts])
    o = np.lexsort((place, inst, prio, ts))
    ts, prio, kind, row, inst = ts[o], prio[o], kind[o], row[o], inst[o]
    pos = np.flatnonzero(kind == 2)
    offset = np.concatenate([[0], np.cumsum([len(d) for d in dues])[:-1]]).astype(np.int64)
    due = np.concatenate(dues)[offset[inst[pos]] + row[pos]]
    key = np.concatenate([np.arange(len(ts)), pos])
    all_ts = np.concatenate([ts, due])
    all_prio = np.concatenate([prio, np.full(len(pos), PRIO_LABEL, dtype=prio.dtype)])
    o = np.lexsort((key, all_prio, all_ts))
    return (
        all_ts[o],
        all_prio[o],
        np.concatenate([kind, np.full(len(pos), 4, dtype=kind.dtype)])[o],
        np.concatenate([row, row[pos]])[o],
        np.concatenate([inst, inst[pos]])[o],
    )


@pytest.mark.parametrize("feed", ["recorded", "lognormal:p5=1ms,p95=300ms"])
def test_the_portfolio_walk_merged_a_chunk_at_a_time_is_the_sorted_walk(pair, feed):
    """Every instrument's streams merged by replay/walk.py give the walk's definition, sorted whole:
    ties of one time between instruments, and labels due together across them, included."""
    import engine.store as store
    import replay.driver as driver
    from engine.latency.spec import parse_latency
    from replay.portfolio import portfolio_walk

    s = store.open_session(pair)
    rng = np.random.default_rng(4)
    books, trades = s.read_table("books15"), s.read_table("trade")
    tapes, dues = [], []
    for sym in ("BTCUSDT", "ETHUSDT"):
        b = books.filter(pc.equal(books.column("symbol"), sym))
        t = trades.filter(pc.equal(trades.column("symbol"), sym))
        tape = driver._Tape(b, t, None if feed == "recorded" else parse_latency(feed, rng), 1.0)
        due = tape.b_loc + 2_000_000
        due[::5] = tape.b_loc[::5] + 1  # labels due together, and with other entries
        tapes.append(tape)
        dues.append(due)
    # ties across the instruments: some ETHUSDT books reach the engine when a BTCUSDT one does
    n = min(len(tapes[0].b_loc), len(tapes[1].b_loc))
    tapes[1].b_loc = tapes[1].b_loc.copy()
    tapes[1].b_loc[:n:3] = tapes[0].b_loc[:n:3]
    dues[1][:n:3] = dues[0][:n:3]
    # and labels due together whose books came in the other order: an ETHUSDT book before a later
    # BTCUSDT one, so by arrival (not by instrument) ETHUSDT's label goes first
    swapped = []
    for i in range(1, n - 10, 11):
        j = int(np.searchsorted(tapes[0].b_loc, tapes[1].b_loc[i], side="right"))
        if j < len(dues[0]):
            dues[1][i] = dues[0][j] = max(dues[0][j], dues[1][i])
            swapped.append(int(dues[1][i]))
    assert len(swapped) > 5
    want = _sorted_walk(tapes, dues)
    walk = portfolio_walk(tapes, dues, chunk=257)
    got = walk.all_entries()
    assert walk.total == len(want[0])
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)
    labels = got[2] == 4
    first_inst = {}  # due time -> the instrument whose label went first
    for t, j in zip(got[0][labels].tolist(), got[4][labels].tolist(), strict=True):
        first_inst.setdefault(t, j)
    assert any(first_inst[t] == 1 for t in swapped)  # ETHUSDT first: its book arrived first


def test_a_kev_cassette_replays_a_portfolio_on_the_compiled_loop(pair, tmp_path):
    """Kev answered from Python at the loop's stops (a cassette, not the compiled rule)."""
    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"))
    rec = run_replay(pair, cfg, out_dir=tmp_path / "rec")
    cas = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), kev_mode="cassette", kev_cassette=str(rec.run_dir))
    k = run_replay(pair, cas, out_dir=tmp_path / "k")
    p = run_replay(pair, cas, out_dir=tmp_path / "p", kernel=False)
    assert k.path.startswith("kernel (a portfolio of 2, books streamed")
    assert k.digest == p.digest
    assert k.counts["command"] == rec.counts["command"] > 0


def test_a_live_portfolios_recorded_latencies_replay_on_the_compiled_loop(pair, tmp_path):
    """Recorded latencies are one table of each kind for every instrument, looked up by key in the
    order the instruments draw (the per-event engines share the model): the loop's cores share the
    order latency tables, and the labels' delays are drawn in the order the engine receives the books
    of both instruments. Every key is recorded twice, so the order of two draws of one key shows."""
    from dataclasses import replace

    from engine.latency.recorded import LatencySink

    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), seed=2)
    base = run_replay(pair, cfg, out_dir=tmp_path / "base").run_dir
    rng = np.random.default_rng(4)
    sink = LatencySink()
    draws = {
        "laya": (f"select ts_recv from '{pair}/books15/*.parquet'", 50_000, 2_000_000),
        "order_entry": ("select ts_recv from 'EV/order.parquet' where kind = 'new'", 1_000_000, 5_000_000),
        "order_response": (
            "select ts_event from 'EV/order.parquet' where kind in ('ack', 'done', 'cancel_ack') "
            "union all select ts_event from 'EV/fill.parquet'",
            500_000,
            4_000_000,
        ),
        "cancel": ("select ts_recv from 'EV/order.parquet' where kind = 'cancel'", 500_000, 3_000_000),
    }
    for kind, (sql, lo, hi) in draws.items():
        for (t,) in _q(base, sql):
            for _ in range(2):
                sink.add(kind, t, int(rng.integers(lo, hi)))
    live = tmp_path / "live"
    live.mkdir()
    sink.write(live)
    specs = {f"latency_{k}": f"recorded:{k}@{live}" for k in draws}
    rec = replace(cfg, **specs)
    k = run_replay(pair, rec, out_dir=tmp_path / "k")
    p = run_replay(pair, rec, out_dir=tmp_path / "p", kernel=False)
    assert k.path.startswith("kernel (a portfolio of 2")
    assert k.counts == p.counts and k.digest == p.digest
    assert k.counts["fill"] > 0 and k.counts["order"] > 100
    # the kinds drawn together: one shared table of a kind, drawn ones each instrument's own
    with pytest.raises(
        DualhubError, match="recorded order latencies for entry, response and cancel together"
    ):
        run_replay(
            pair, replace(cfg, latency_order_entry=specs["latency_order_entry"]), out_dir=tmp_path / "m"
        )
    assert not (tmp_path / "m").exists()


def test_two_instruments_trade_as_one_portfolio(pair, tmp_path):
    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"))
    a = run_replay(pair, cfg, out_dir=tmp_path / "a")
    b = run_replay(pair, cfg, out_dir=tmp_path / "b")
    assert a.digest == b.digest  # deterministic
    run = a.run_dir
    for stream in ("order", "fill", "command", "risk", "label"):
        syms = _q(run, f"select distinct symbol from 'EV/{stream}.parquet' order by 1")
        assert syms == [("BTCUSDT",), ("ETHUSDT",)], stream
    # one id space: no client oid names orders of two instruments
    assert _q(run, "select count(*) from (select client_oid from 'EV/order.parquet' group by 1 "
                   "having count(distinct symbol) > 1)") == [(0,)]  # fmt: skip
    # ETH trades on its own contract (tick 0.01) and at BTC's notional (sizes scaled by price)
    eth = _q(run, "select min(qty), max(qty) from 'EV/order.parquet' "
                  "where symbol = 'ETHUSDT' and kind = 'new' and order_type = 'limit'")  # fmt: skip
    assert eth[0][0] == eth[0][1] and 0.04 < eth[0][0] < 0.1
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["symbols"] == ["BTCUSDT", "ETHUSDT"]
    assert manifest["inputs"]["books15"] == sum(
        r for (r,) in duckdb.sql(f"select count(*) from '{pair}/books15/*.parquet'").fetchall()
    )
    runtime = json.loads((run / "runtime.json").read_text())
    assert runtime["engine"] == "engine/kernel" and "portfolio of 2" in runtime["engine_path"]
    assert "portfolio_net_delta" in runtime["risk_rules"]


def test_the_portfolio_limits_bind_on_the_replayed_pair(pair, tmp_path):
    cfg = ReplayConfig(
        symbols=("BTCUSDT", "ETHUSDT"),
        risk=RiskLimits(portfolio_max_gross_usd=200.0, portfolio_max_net_delta_usd=150.0),
    )
    run = run_replay(pair, cfg, out_dir=tmp_path / "r").run_dir
    bound = _q(
        run, "select distinct symbol from 'EV/risk.parquet' where reason like 'portfolio_%' order by 1"
    )
    assert bound == [("BTCUSDT",), ("ETHUSDT",)]
    assert (
        json.loads((run / "manifest.json").read_text())["config"]["risk"]["portfolio_max_gross_usd"] == 200.0
    )


def test_portfolio_limits_from_the_command_line_reach_the_risk_decisions_and_the_config(
    pair, tmp_path, capsys
):
    """``--portfolio`` sets the portfolio's limits for ``dualhub replay`` (and ``live``): they bind on
    both legs, the run's config holds them, and a limit that is not a finite positive number, an
    unknown or a repeated key is one error line."""
    from dualhub.cli import main

    run = tmp_path / "r"
    argv = ["replay", str(pair), "--symbols", "ALL", "--out", str(run)]
    assert main([*argv, "--portfolio", "gross_usd=200,net_delta_usd=150,loss_stop_usd=75"]) == 0
    bound = _q(
        run, "select distinct symbol from 'EV/risk.parquet' where reason like 'portfolio_%' order by 1"
    )
    assert bound == [("BTCUSDT",), ("ETHUSDT",)]
    risk = json.loads((run / "manifest.json").read_text())["config"]["risk"]
    assert (
        risk["portfolio_max_gross_usd"],
        risk["portfolio_max_net_delta_usd"],
        risk["portfolio_loss_stop_usd"],
    ) == (
        200.0,
        150.0,
        75.0,
    )
    capsys.readouterr()
    for spec, why in (
        ("net_delta_usd=1e400", "--portfolio: net_delta_usd=1e400 must be a finite number > 0"),
        ("gross_usd=-5", "--portfolio: gross_usd=-5 must be a finite number > 0"),
        ("gross_usd=nan", "--portfolio: gross_usd=nan must be a finite number > 0"),
        ("delta=5", "--portfolio: unknown key 'delta' (keys: net_delta_usd, gross_usd, loss_stop_usd)"),
        ("gross_usd=5,gross_usd=6", "--portfolio: gross_usd given twice"),
        (
            "gross_usd",
            "--portfolio 'gross_usd': expected KEY=VALUE (keys: net_delta_usd, gross_usd, loss_stop_usd)",
        ),
    ):
        out = tmp_path / "bad"
        assert main(["replay", str(pair), "--symbols", "ALL", "--out", str(out), "--portfolio", spec]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"dualhub replay: error: {why}"]
        assert not out.exists()


def test_dualhub_replay_symbols_runs_the_portfolio_and_refuses_an_unknown_symbol(pair, tmp_path, capsys):
    from dualhub.cli import main

    assert main(["replay", str(pair), "--symbols", "ALL", "--out", str(tmp_path / "r")]) == 0
    assert "portfolio of 2" in capsys.readouterr().out
    assert main(["replay", str(pair), "--symbols", "BTCUSDT,XRPUSDT", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"dualhub replay: error: {pair} has no XRPUSDT; its symbols: BTCUSDT, ETHUSDT"
    assert not (tmp_path / "x").exists()


def test_a_symbol_the_session_lacks_is_one_error_line(pair, tmp_path):
    with pytest.raises(DualhubError, match="has no SOLUSDT; its symbols: BTCUSDT, ETHUSDT"):
        run_replay(pair, ReplayConfig(symbols=("BTCUSDT", "SOLUSDT")), out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(DualhubError, match="given twice"):
        ReplayConfig(symbols=("BTCUSDT", "BTCUSDT"))


@pytest.mark.parametrize("n", [8, 3])  # 3: a core by constant index (STATIC_CORES), 8: by a variable one
def test_the_eight_symbol_bitget_capture_replays_as_one_portfolio(tmp_path, n):
    from replay.kernel import STATIC_CORES

    m = import_bitget_v1(REAL / "bitget-v1" / "BITGET.ws.1.0", tmp_path / "s")
    assert len(m["symbols"]) == 8
    assert (n <= STATIC_CORES) == (n == 3)
    # Quotes at the touch, filled by any trade at their price: 30 s of a spot capture is short. Sizes
    # are AVAXUSDT's (83 USDT) and scale to the others' notional: CULTUSDT (3.5e-5 USDT) quotes 470.
    cfg = ReplayConfig(
        symbols=tuple(m["symbols"]) if n == 8 else ("AVAXUSDT", "SUNUSDT", "VVSUSDT"),  # the two that fill
        fill_model="touch",
        quotes=QuoteConfig(offset_ticks=0, quote_qty=0.0002),
        risk=RiskLimits(max_order_qty=0.0002, max_position=0.0004),
    )
    r = run_replay(tmp_path / "s", cfg, out_dir=tmp_path / "r")
    assert r.path.startswith(f"kernel (a portfolio of {n}, books streamed")
    assert run_replay(tmp_path / "s", cfg, out_dir=tmp_path / "p", kernel=False).digest == r.digest
    run = r.run_dir
    traded = _q(run, "select count(distinct symbol) from 'EV/order.parquet' where kind = 'new'")[0][0]
    advised = _q(run, "select count(distinct symbol) from 'EV/command.parquet'")[0][0]
    filled = _q(run, "select count(distinct symbol) from 'EV/fill.parquet'")[0][0]
    assert traded >= n - 2 and advised >= 2 and filled >= 2, (traded, advised, filled)
    # each symbol quotes on the tick its recorded prices show (CULTUSDT trades at 1e-5 USDT)
    cult = _q(run, "select min(px) from 'EV/order.parquet' where symbol = 'CULTUSDT' and kind = 'new'")
    assert cult[0][0] is None or 0 < cult[0][0] < 0.001


def test_a_low_priced_coin_and_large_sizes_trade_in_whole_lots(tmp_path):
    """DOGEUSDT (whole coins, 6 price decimals) beside BTCUSDT quoting 10 BTC (900 000 USDT): positions
    of millions of coins and cash past the 9.2 million USDT an int64 of 1e-12 holds, kept exactly; the
    compiled loop and the per-event engine agree."""
    s = simulate_session(tmp_path / "s", symbols=("BTCUSDT", "DOGEUSDT"), minutes=1.0, seed=23)
    cfg = ReplayConfig(
        symbols=("BTCUSDT", "DOGEUSDT"),
        quotes=QuoteConfig(quote_qty=10.0),
        risk=RiskLimits(
            max_position=500.0, max_order_qty=50.0, max_net_delta_usd=1e12, daily_loss_stop_usd=1e12
        ),
    )
    r = run_replay(s, cfg, out_dir=tmp_path / "k")
    assert r.path.startswith("kernel (a portfolio of 2")
    assert run_replay(s, cfg, out_dir=tmp_path / "p", kernel=False).digest == r.digest
    (doge,) = _q(
        r.run_dir,
        "select max(abs(position_after)), bool_and(qty = round(qty)) from 'EV/fill.parquet' "
        "where symbol = 'DOGEUSDT'",
    )
    assert doge[0] > 1e6 and doge[1]  # more than the 4 503 coins integers of 1e-12 held
    (low,) = _q(
        r.run_dir,
        "select min(c) from (select sum(if(side = 'buy', -notional, notional)) over "
        "(partition by symbol order by seq) c from 'EV/fill.parquet')",
    )
    assert low[0] < -9_300_000


def test_kev_as_the_hub_sets_both_legs_with_the_fitted_hedge_ratio(pair, tmp_path):
    cfg = ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), kev_hub="pairs")
    r = run_replay(pair, cfg, out_dir=tmp_path / "r")
    run = r.run_dir
    assert r.kev["name"] == "rules-pairs"
    # one command, one id, a row per instrument: the asking one's first
    per_cmd = _q(
        run, "select command_id, count(*), count(distinct symbol) from 'EV/command.parquet' group by 1"
    )
    assert per_cmd and all(n == 2 and d == 2 for _, n, d in per_cmd)
    assert _q(run, "select count(*) from 'EV/kev_response.parquet' where ok") == [(len(per_cmd),)]
    # the leader's rows hedge nothing; the follower's carry the pair's fitted hedge ratio, near the truth
    assert _q(run, "select distinct hedge_ratio from 'EV/command.parquet' where symbol = 'BTCUSDT'") == [
        (1.0,)
    ]
    fitted = [h for (h,) in _q(run, "select hedge_ratio from 'EV/command.parquet' where symbol = 'ETHUSDT'")]
    truth = json.loads((pair / "manifest.json").read_text())["simulator"]["pairs"][0]["regimes"]
    betas = [g["beta"] for g in truth]
    warm = [h for h in fitted if h != 1.0]  # 1.0: no fit yet
    assert warm and 0.5 * min(betas) < sum(warm) / len(warm) < 1.5 * max(betas)
    # an entry puts the legs on opposite sides; the engine trades both
    opposite = _q(
        run,
        "select count(*) from 'EV/command.parquet' b join 'EV/command.parquet' e using (command_id) "
        "where b.symbol = 'BTCUSDT' and e.symbol = 'ETHUSDT' and b.target_position * e.target_position < 0",
    )
    assert opposite[0][0] > 0
    kev_orders = _q(run, "select distinct symbol from 'EV/risk.parquet' where source = 'kev' order by 1")
    assert kev_orders == [("BTCUSDT",), ("ETHUSDT",)]
    with pytest.raises(DualhubError, match="needs a portfolio"):
        ReplayConfig(symbols=("BTCUSDT",), kev_hub="pairs")


def test_an_instrument_flag_sets_its_sizes_in_the_run(pair, tmp_path):
    from dualhub.cli import main

    out = tmp_path / "r"
    argv = [
        "replay",
        str(pair),
        "--symbols",
        "ALL",
        "--instrument",
        "ETHUSDT:quote_qty=0.05",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    qty = _q(
        out, "select distinct qty from 'EV/order.parquet' where symbol = 'ETHUSDT' and order_type = 'limit'"
    )
    assert qty == [(0.05,)]
    assert json.loads((out / "manifest.json").read_text())["config"]["instruments"] == {
        "ETHUSDT": {"quote_qty": 0.05}
    }
    assert (
        main(
            [
                "replay",
                str(pair),
                "--symbols",
                "ALL",
                "--instrument",
                "ETHUSDT:qty=1",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )


def test_llama_server_as_the_hub_answers_one_v2_command_for_both_instruments(
    pair, llama_server, tmp_path, caplog
):
    cfg = ReplayConfig(
        symbols=("BTCUSDT", "ETHUSDT"),
        kev_hub="llm",
        kev_mode="llm",
        kev_url=llama_server.url,
        kev_min_interval_ms=20_000,  # a few questions: SmolLM2 takes seconds for each
        kev_timeout_ms=60_000,
    )
    run = run_replay(pair, cfg, out_dir=tmp_path / "r").run_dir
    answers = _q(run, "select ok, raw, failure, error from 'EV/kev_response.parquet'")
    # every answer is a v2 command the schema took; one that contradicts itself (SmolLM2 sometimes puts
    # both legs long beside a hedge ratio) is refused by the sense check with its reason, never traded
    assert answers and all(json.loads(raw)["schema_version"] == 2 for _, raw, _, _ in answers if raw)
    assert all(
        ok or (f == "inconsistent" and e.startswith("command_inconsistent: ")) for ok, _, f, e in answers
    )
    applied = sum(ok for ok, _, _, _ in answers)
    per_cmd = _q(run, "select count(*), count(distinct symbol) from 'EV/command.parquet' group by command_id")
    assert len(per_cmd) == applied and set(per_cmd) <= {(2, 2)}
    assert "rejected the JSON schema" not in caplog.text  # the v2 schema is one llama-server takes
    with pytest.raises(DualhubError, match="needs kev_mode llm"):
        ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), kev_hub="llm")


@pytest.mark.parametrize("mode", ["tick", "batch"])
def test_features_v1_label_a_portfolio_on_the_compiled_loop(pair, tmp_path, mode):
    """Features v1 (each book with the trades its instrument received before it): labelled from whole
    tables before the walk, per tick or in a batch, the bits the per-event engines compute."""
    from engine.laya.labels import LabelConfig
    from replay.train_cli import train

    model = tmp_path / "v1.onnx"
    train([pair], model, features="v1", labels=LabelConfig(lean_bps=1.0, emergency_bps=3.0), folds=2)
    cfg = ReplayConfig(
        symbols=("BTCUSDT", "ETHUSDT"), model_path=model, laya_features="v1", laya_mode=mode, seed=4
    )
    k = run_replay(pair, cfg, out_dir=tmp_path / "k")
    p = run_replay(pair, cfg, out_dir=tmp_path / "p", kernel=False)
    assert k.path == "kernel (a portfolio of 2)"
    assert k.counts == p.counts and k.digest == p.digest
    assert len(_q(k.run_dir, "select distinct label from 'EV/label.parquet'")) > 1


def test_a_portfolio_trades_each_instruments_fees_from_the_sessions_spec(pair, tmp_path):
    """As a single-instrument replay does: the manifest's spec of each symbol, fees included."""
    import shutil

    s = tmp_path / "fees"
    shutil.copytree(pair, s, ignore=shutil.ignore_patterns("runs"))
    m = json.loads((s / "manifest.json").read_text())
    rates = {"BTCUSDT": ("0.0001", "0.0004"), "ETHUSDT": ("0.00015", "0.0005")}
    m["contracts"] = {
        sym: {**{k: str(v) for k, v in inst.items()}, "min_qty": str(inst["size_step"]),
              "maker_fee_rate": rates[sym][0], "taker_fee_rate": rates[sym][1],
              "contract_type": "perpetual", "spec_source": "known"}
        for sym, inst in m["simulator"]["instruments"].items()
    }  # fmt: skip
    (s / "manifest.json").write_text(json.dumps(m))
    res = run_replay(
        s, ReplayConfig(symbols=("BTCUSDT", "ETHUSDT"), laya_provider="cpu"), out_dir=tmp_path / "r"
    )
    rows = _q(res.run_dir, "SELECT symbol, liquidity, notional::DOUBLE, fee::DOUBLE FROM 'EV/fill.parquet'")
    assert {r[0] for r in rows} == {"BTCUSDT", "ETHUSDT"}
    for sym, liq, notional, fee in rows:
        rate = float(rates[sym][0 if liq == "maker" else 1])
        assert fee == pytest.approx(notional * rate, rel=1e-6, abs=1e-9), (sym, liq)


def test_a_session_without_a_spec_trades_the_grids_its_data_shows():
    """The importers' inference (engine.contract.grid_unit), every value read, to 12 decimals."""
    import pyarrow as pa

    from engine.contract import ContractConfig
    from replay.portfolio import recorded_contract

    books = pa.table(
        {
            "symbol": ["PEPEUSDT"] * 3,
            "bid_px_0": [0.00001234, 0.00001235, 0.000012341],
            "ask_px_0": [0.00001236, 0.00001237, 0.00001238],
            "bid_sz_0": [100.0, 2500.5, 7.0],
            "ask_sz_0": [1.0, 2.0, 3.0],
        }
    )
    trades = pa.table({"px": [0.00001236], "sz": [0.25]})
    c = recorded_contract({}, books, trades, ContractConfig())
    assert (c.symbol, c.tick, c.size_step, c.min_qty) == ("PEPEUSDT", 1e-9, 0.01, 0.01)
    bad = books.set_column(1, "bid_px_0", pa.array([1e-13, 0.1, 0.2]))
    with pytest.raises(DualhubError, match="PEPEUSDT: the data's prices lie on no decimal grid"):
        recorded_contract({}, bad, trades, ContractConfig())
