"""``dualhub live --symbols BTCUSDT,ETHUSDT``: one engine and one risk gateway over both symbols, paper
mode against the local exchange, and the run replays to the same decisions (replay/portfolio.py)."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq
import pytest

from live.config import PORTFOLIO_RUN
from live.runner import LiveConfig, run_live
from replay.diff import COMPARABLE_STREAMS, diff_runs
from replay.driver import run_replay
from replay.parity import check_parity, replay_config_for
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames

SPEED = 10.0
JITTER = "lognormal:p5=1ms,p95=9ms"
SYMBOLS = ("BTCUSDT", "ETHUSDT")
# ETH at 1/30 of BTC's price: the same notional per quote and limit
ETH = {"quote_qty": 0.06, "max_position": 1.5, "max_order_qty": 0.6}


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    frames = list(simulator_frames(list(SYMBOLS), minutes=2, seed=3))
    out = tmp_path_factory.mktemp("live") / "paper"
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        res = run_live(
            LiveConfig(
                out=str(out),
                exchange_url=ex.rest_url,
                ws_url=ex.ws_url,
                laya_provider="cpu",
                duration_s=6.0,
                symbols=SYMBOLS,
                instruments={"ETHUSDT": ETH},
                latency_order_entry=JITTER,
                latency_order_response=JITTER,
                seed=7,
            )
        )
    return res


def _rows(t):
    return orjson.dumps(t.to_pylist(), default=str)  # NaN (a market order's price) as null: equal to itself


def test_two_symbols_are_one_engine_one_run(paper):
    assert paper.exit_code == 0 and paper.stopped_by == "duration"
    run = paper.run_dirs["BTCUSDT"]
    assert run == paper.run_dirs["ETHUSDT"] and run.name == PORTFOLIO_RUN
    m = orjson.loads((run / "manifest.json").read_bytes())
    assert m["symbols"] == list(SYMBOLS) and m["kind"] == "live"
    assert m["engine_configs"]["ETHUSDT"]["quotes"]["quote_qty"] == ETH["quote_qty"]
    assert m["engine_configs"]["ETHUSDT"]["contract"]["tick"] == 0.01  # the local exchange's contract
    orders = pq.read_table(run / "events" / "order.parquet").to_pylist()
    by = {s: [o for o in orders if o["symbol"] == s] for s in SYMBOLS}
    assert all(len(v) > 10 for v in by.values()), {s: len(v) for s, v in by.items()}
    oids = [o["client_oid"] for o in orders if o["kind"] == "new"]
    assert len(oids) == len(set(oids))  # one id space across the instruments
    fills = {r["symbol"] for r in pq.read_table(run / "events" / "fill.parquet").to_pylist()}
    assert fills == set(SYMBOLS)
    risk = pq.read_table(run / "events" / "risk.parquet").to_pylist()
    assert {r["symbol"] for r in risk} == set(SYMBOLS)


def test_the_portfolio_run_replays_to_the_same_decisions(paper, tmp_path):
    run = paper.run_dirs["BTCUSDT"]
    cfg = replay_config_for(run)
    assert cfg.symbols == SYMBOLS and cfg.instruments["ETHUSDT"]["quote_qty"] == ETH["quote_qty"]
    rr = run_replay(paper.session_dir, cfg, out_dir=tmp_path / "replay")
    assert rr.path.startswith("kernel (a portfolio of 2")  # recorded latencies on the compiled loop
    full = diff_runs(run, rr.run_dir, streams=COMPARABLE_STREAMS)
    assert not full.diverged, full.to_json()["divergence"]
    assert full.compared_a == full.compared_b > 100
    for stream in ("label", "order", "fill", "risk", "command", "latency", "kev_request"):
        a = pq.read_table(run / "events" / f"{stream}.parquet")
        b = pq.read_table(rr.run_dir / "events" / f"{stream}.parquet")
        assert _rows(a) == _rows(b), stream
    p = check_parity(run, tmp_path / "parity")
    assert not p.diverged and p.replay_run.name == "parity-portfolio"


def test_kev_as_the_hub_live_and_its_replay(tmp_path):
    """The pairs rule answering for the portfolio in paper live mode: one v2 command per answer sets
    both legs; the run's cassette of v2 answers replays to the same decisions."""
    frames = list(simulator_frames(list(SYMBOLS), minutes=2, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        res = run_live(
            LiveConfig(
                out=str(tmp_path / "hub"),
                exchange_url=ex.rest_url,
                ws_url=ex.ws_url,
                laya_provider="cpu",
                duration_s=6.0,
                symbols=SYMBOLS,
                instruments={"ETHUSDT": ETH},
                kev_hub="pairs",
                pair_half_life_ms=5_000,  # 6 s of data: a fit that warms up inside the run
                seed=7,
            )
        )
    run = res.run_dirs["BTCUSDT"]
    cmds = pq.read_table(run / "events" / "command.parquet").to_pylist()
    assert cmds and {c["symbol"] for c in cmds} == set(SYMBOLS)
    per = {}
    for c in cmds:
        per.setdefault(c["command_id"], []).append(c["symbol"])
    assert all(sorted(v) == sorted(SYMBOLS) for v in per.values())
    raw = pq.read_table(run / "events" / "kev_response.parquet").column("raw").to_pylist()
    assert all(orjson.loads(r)["schema_version"] == 2 for r in raw if r)
    cfg = replay_config_for(run)
    assert cfg.kev_hub == "pairs" and cfg.kev_mode == "cassette"
    rr = run_replay(res.session_dir, cfg, out_dir=tmp_path / "replay")
    assert rr.path.startswith("kernel (a portfolio of 2")  # the hub from its cassette, compiled loop
    d = diff_runs(run, rr.run_dir, streams=COMPARABLE_STREAMS)
    assert not d.diverged, d.to_json()["divergence"]
    assert rr.counts["command"] == len(cmds)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """Live paper on two symbols with no size named for ETHUSDT: its sizes are scaled at the start, by
    the local exchange's tickers, as replay scales them by the session's first books."""
    frames = list(simulator_frames(list(SYMBOLS), minutes=2, seed=3))
    out = tmp_path_factory.mktemp("live") / "scaled"
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        res = run_live(
            LiveConfig(
                out=str(out),
                exchange_url=ex.rest_url,
                ws_url=ex.ws_url,
                laya_provider="cpu",
                duration_s=6.0,
                symbols=SYMBOLS,
                latency_order_entry=JITTER,
                latency_order_response=JITTER,
                seed=7,
            )
        )
    assert res.exit_code == 0, res.errors
    return res


def test_live_starts_with_the_instrument_settings_replay_resolves(scaled):
    """The same resolution (engine.instruments.resolve_instruments): live's engine configs, recorded in
    its manifest, are those replay resolves for the session it recorded."""
    from engine.store import open_session
    from live.finish import _engine_config_json
    from replay.portfolio import _instrument_configs

    run = scaled.run_dirs["BTCUSDT"]
    m = orjson.loads((run / "manifest.json").read_bytes())
    eth = m["engine_configs"]["ETHUSDT"]
    assert (eth["quotes"]["quote_qty"], eth["risk"]["max_position"], eth["risk"]["max_order_qty"]) == (
        0.05, 1.49, 0.59,
    )  # fmt: skip  # BTC's 0.002, 0.05, 0.02 x ~29.9 (0.0598, 1.495, 0.598) down to ETH's lots of 0.01
    assert set(m["reference_mids"]) == set(SYMBOLS)
    cfg = replay_config_for(run, instruments={})  # nothing named: replay resolves the sizes itself
    session = open_session(scaled.session_dir)
    books, trades = (session.read_symbols(s, list(SYMBOLS)) for s in ("books15", "trade"))
    tables = list(zip(books, trades, strict=True))
    first = {
        s: (b.column("bid_px_0")[0].as_py(), b.column("ask_px_0")[0].as_py())
        for s, b in zip(SYMBOLS, books, strict=True)
    }
    # the tickers answered the books the session starts with
    assert m["reference_mids"] == {s: (bid + ask) / 2 for s, (bid, ask) in first.items()}
    replayed = _instrument_configs(session, cfg, list(SYMBOLS), tables)
    assert {e.symbol: _engine_config_json(e) for e in replayed} == m["engine_configs"]


def test_the_scaled_run_replays_identically(scaled, tmp_path):
    run = scaled.run_dirs["BTCUSDT"]
    orders = pq.read_table(run / "events" / "order.parquet").to_pylist()
    eth_new = [o for o in orders if o["symbol"] == "ETHUSDT" and o["kind"] == "new"]
    assert eth_new and all(round(o["qty"] / 0.01, 6) % 1 == 0 for o in eth_new)  # whole ETH lots
    p = check_parity(run, tmp_path / "parity")
    assert not p.diverged and p.compared > 100, p.diff.to_json()["divergence"]
    # and a replay naming nothing, its sizes resolved from the session, makes the same decisions
    rr = run_replay(scaled.session_dir, replay_config_for(run, instruments={}), out_dir=tmp_path / "replay")
    d = diff_runs(run, rr.run_dir, streams=COMPARABLE_STREAMS)
    assert not d.diverged and d.compared_a == d.compared_b > 100, d.to_json()["divergence"]


def test_a_quote_size_between_two_lots_is_the_same_line_in_live_and_replay(scaled, tmp_path, capsys):
    """ETHUSDT's lot is 0.01 (the exchange's contract, the session's): a named quote size of 0.015 is
    no whole number of them, and both modes stop at the start with the same line naming the fix."""
    from dualhub.cli import main

    bad = ["--symbols", ",".join(SYMBOLS), "--instrument", "ETHUSDT:quote_qty=0.015", "--provider", "cpu"]
    frames = list(simulator_frames(list(SYMBOLS), minutes=1, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        rc = main(
            ["live", "--paper", *bad, "--exchange-url", ex.rest_url, "--ws-url", ex.ws_url,
             "--out", str(tmp_path / "paper"), "--duration", "2"]
        )  # fmt: skip
    live_line = capsys.readouterr().err.splitlines()[-1]
    rc_replay = main(["replay", str(scaled.session_dir), *bad, "--out", str(tmp_path / "replay")])
    replay_line = capsys.readouterr().err.splitlines()[-1]
    why = (
        "ETHUSDT: quote_qty 0.015 is not a whole number of size steps (0.01): "
        "give the instrument its own (--instrument ETHUSDT:quote_qty=Q)"
    )
    assert (rc, rc_replay) == (2, 2)
    assert (live_line, replay_line) == (f"dualhub live: error: {why}", f"dualhub replay: error: {why}")
    assert not (tmp_path / "paper").exists()  # BTCUSDT's run was being made: nothing of it is left
    assert not (tmp_path / "replay").exists()


def test_no_ticker_is_one_line_naming_the_way_out(tmp_path, capsys):
    """The exchange has no price for ETHUSDT (no book of it in its feed): its sizes cannot be scaled,
    and the run refuses to start with one line naming the flag that gives them."""
    from dualhub.cli import main

    frames = list(simulator_frames(["BTCUSDT"], minutes=1, seed=3))
    with LocalExchangeThread(LocalExchange(frames, speed=SPEED, symbols=SYMBOLS)) as ex:
        rc = main(
            ["live", "--paper", "--symbols", ",".join(SYMBOLS), "--exchange-url", ex.rest_url,
             "--ws-url", ex.ws_url, "--out", str(tmp_path / "paper"), "--duration", "2", "--provider", "cpu"]
        )  # fmt: skip
    assert rc == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "dualhub live: error: ETHUSDT: no reference price of ETHUSDT to scale the first instrument's sizes "
        "to it: give them (--instrument ETHUSDT:quote_qty=Q,max_position=P,max_order_qty=O)"
    )
    assert not (tmp_path / "paper").exists()
